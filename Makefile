# SPDX-License-Identifier: MIT
# dlock -- `make demo` and `make test` work on a fresh Debian 12 machine:
# they install what they need (apt), build, and run.

BUILD ?= build
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS ?=
# tests run at once by ctest (the suites wait on leases and servers far
# more than they compute: CI runs the sanitizer suites with more)
TEST_JOBS ?= $(JOBS)
# warnings as errors: OFF for a user's or a packager's build, ON in CI
# (.ci/run) and for development (make WERROR=ON ...)
WERROR ?= OFF

.PHONY: all build demo test test-busy build-matrix asan valgrind valgrind-all bench bench-quick install clean fuzz
# the trees alone, without their runs (CI builds them beside its busy
# run, as its load: .ci/run)
.PHONY: asan-build valgrind-build bench-build fuzz-build

all: build

build:
	@scripts/install-deps.sh build
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_WERROR=$(WERROR) $(CMAKE_ARGS) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

# the seeds' counter example across processes, on the default file store
demo: build
	@scripts/demo.sh $(BUILD)/dlock

# the whole suite against real stores (each test starts its own servers)
test: build
	@scripts/install-deps.sh test
	cd $(BUILD) && ctest --output-on-failure -j$(TEST_JOBS)

# `make test` while stress-ng keeps every core busy: every timing bound in
# a test must hold on a machine that does other things (CI runs the
# README's test command so)
test-busy:
	scripts/busy.sh $(MAKE) test

# the builds users and packagers make, from scratch: the build types with
# gcc, Release with clang (the two Release builds with the tests), every
# store built in, stores left out (scripts/build-matrix.sh; CI runs it with
# WERROR=ON)
build-matrix:
	@scripts/install-deps.sh build asan
	WERROR=$(WERROR) scripts/build-matrix.sh

# the suite again under AddressSanitizer + UndefinedBehaviorSanitizer
# (clang: gcc's ASan misreports the thread cancellation used by file waits)
asan: asan-build
	@scripts/install-deps.sh test
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j$(TEST_JOBS)
asan-build:
	@scripts/install-deps.sh build asan
	CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug \
	    -DDLOCK_SANITIZER=address,undefined -DDLOCK_BENCH=OFF -DDLOCK_WERROR=$(WERROR) >/dev/null
	cmake --build build-asan -j$(JOBS)

# the tests labelled memcheck under valgrind memcheck (uninitialised
# reads, leaks and invalid accesses): the unit tests, the generic suites
# on every store and the exporter; the store-specific suites run under
# ASan (docs/development.md, "Which suites run under which tool")
valgrind: valgrind-build
	@scripts/install-deps.sh test
	cd build-valgrind && ctest --output-on-failure -L memcheck -j$(TEST_JOBS)
# and the store-specific suites too (but ZooKeeper's: they fork beside
# its client's threads), as every CI ran them before: for a change to a
# store's failure paths
valgrind-all: valgrind-build
	@scripts/install-deps.sh test
	cd build-valgrind && ctest --output-on-failure -L 'memcheck|store' -LE zk -j$(TEST_JOBS)
valgrind-build:
	@scripts/install-deps.sh build valgrind
	cmake -S . -B build-valgrind -DCMAKE_BUILD_TYPE=Debug -DDLOCK_VALGRIND=ON \
	    -DDLOCK_BENCH=OFF -DDLOCK_WERROR=$(WERROR) >/dev/null
	cmake --build build-valgrind -j$(JOBS)

bench: bench-build
	bench/run.sh build-bench

# the short bench CI runs: every section, fewer samples (build-bench/
# benchmarks-quick.md and charts); checks that its output parses
bench-quick: bench-build
	bench/run.sh build-bench --quick
	python3 bench/check.py build-bench/benchmarks-quick.md --charts build-bench
bench-build:
	@scripts/install-deps.sh build bench
	cmake -S . -B build-bench -DCMAKE_BUILD_TYPE=Release -DDLOCK_TESTS=OFF -DDLOCK_WERROR=$(WERROR) >/dev/null
	cmake --build build-bench -j$(JOBS)

# libFuzzer targets (fuzz/), FUZZ_SECONDS each on their corpus; fails on
# any crash, leak, UB or broken invariant. Long runs: make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 10
fuzz: fuzz-build
	fuzz/run.sh build-fuzz $(FUZZ_SECONDS)
fuzz-build:
	@scripts/install-deps.sh build asan
	CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDLOCK_FUZZ=ON \
	    -DDLOCK_TESTS=OFF -DDLOCK_BENCH=OFF -DDLOCK_WERROR=$(WERROR) >/dev/null
	cmake --build build-fuzz -j$(JOBS) --target fuzz_all

# the safety suite (docs/safety.md): worker processes, a fenced resource and
# faults on every store; fails when an outcome is worse than expected. The
# full run rewrites the tables in docs/safety.md (exclusive holds, then
# --mixed: readers and writers on the stores with shared holds); SAFETY_QUICK=1 (or
# safety-quick) is the short form for CI, its tables in $(BUILD)/safety-quick.md
# and $(BUILD)/safety-mixed-quick.md. The two runs are two targets: the short
# forms may run at once (make -j2 -O safety-quick, as CI does); the full
# ones one after the other (both rewrite docs/safety.md). The SQL servers'
# data directories come from the build's test cache (tests/servers/sqlserver.sh)
.PHONY: safety safety-quick safety-exclusive safety-mixed
SAFETY_QUICK ?=
safety_quick = $(filter-out 0,$(SAFETY_QUICK))
safety_env = DLOCK_TEST_CACHE=$(abspath $(BUILD))/test-cache
safety: safety-exclusive safety-mixed
safety-exclusive: build
	@scripts/install-deps.sh test
	$(safety_env) $(BUILD)/tests/safety/dlock_safety $(if $(safety_quick),--quick --table $(BUILD)/safety-quick.md,--doc docs/safety.md --table $(BUILD)/safety.md)
safety-mixed: build $(if $(safety_quick),,safety-exclusive)
	@scripts/install-deps.sh test
	$(safety_env) $(BUILD)/tests/safety/dlock_safety --mixed $(if $(safety_quick),--quick --table $(BUILD)/safety-mixed-quick.md,--doc docs/safety.md --table $(BUILD)/safety-mixed.md)
safety-quick:
	$(MAKE) safety SAFETY_QUICK=1

# the Python package as a wheel that carries libdlock and its store
# modules, built in build-wheel/ (Release): dist/libdlock-<version>-py3-none-<platform>.whl
# (scripts/wheel.sh; docs/python.md, "Installing")
.PHONY: wheel
wheel:
	@scripts/install-deps.sh build wheel
	JOBS=$(JOBS) scripts/wheel.sh

# as root into this machine (no DESTDIR), ldconfig then makes the new
# libdlock.so.0 known to the dynamic linker: programs and Python's ctypes
# find it by name (docs/install.md)
install: build
	cmake --install $(BUILD)
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then echo ldconfig; ldconfig; fi

# Debian packages of this tree (debian/): built by dpkg-buildpackage in
# build-deb/, checked by lintian, the .deb files put in dist/;
# scripts/check-debs.sh installs and tries them (docs/install.md)
.PHONY: deb
deb:
	@scripts/install-deps.sh build deb
	JOBS=$(JOBS) scripts/deb.sh

clean:
	rm -rf $(BUILD) build-asan build-valgrind build-bench build-fuzz build-ci build-deb

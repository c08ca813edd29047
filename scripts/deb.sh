#!/bin/sh
# SPDX-License-Identifier: MIT
# deb.sh -- `make deb`: builds dlock's Debian packages (debian/) from this
# tree with dpkg-buildpackage and checks them with lintian. The build runs
# in a copy of the tree, build-deb/dlock-VERSION/ (so that debhelper's
# files and the obj-* build directory stay out of the work tree); the
# .deb files, the .buildinfo and the .changes go into dist/. Fails when
# debian/changelog's version is not CMakeLists.txt's or lintian reports an
# error (warnings are printed; docs/install.md lists the ones left).
#   JOBS   parallel compile jobs (default: the number of cores)
set -eu
cd "$(dirname "$0")/.."
top=$PWD
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}

# the upstream version, once: CMakeLists.txt's project(... VERSION x.y.z)
version=$(sed -n 's/^project(dlock VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
deb_version=$(dpkg-parsechangelog -l debian/changelog -S Version)
if [ -z "$version" ] || [ "${deb_version%-*}" != "$version" ]; then
    echo "deb: debian/changelog's version is $deb_version, CMakeLists.txt's" \
        "is '$version': add a changelog entry (dch -v $version-1)" >&2
    exit 1
fi

work=$top/build-deb
src=$work/dlock-$version
rm -rf "$work"
mkdir -p "$src"
# the tree as it is (uncommitted changes too), without builds and without
# what git ignores; a tree that is not a git checkout is copied whole but
# for its build directories
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
    # shellcheck disable=SC2016 # the inner shell's variable
    git ls-files -z --cached --others --exclude-standard |
        xargs -0 sh -c 'for f; do [ -e "$f" ] && printf "%s\0" "$f"; done' sh |
        tar --null -T - -cf - | tar -C "$src" -xf -
else
    tar --exclude='./build' --exclude='./build-*' --exclude='./dist' \
        --exclude='./.git' -cf - . | tar -C "$src" -xf -
fi

echo "deb: building dlock $deb_version in $src"
(cd "$src" && dpkg-buildpackage -b --no-sign -j"$jobs") >"$work/build.log" 2>&1 || {
    tail -60 "$work/build.log" >&2
    echo "deb: dpkg-buildpackage failed (whole log: $work/build.log)" >&2
    exit 1
}
grep -E '^dpkg-deb: building package' "$work/build.log" || true

mkdir -p dist
rm -f dist/*.deb dist/*.buildinfo dist/*.changes
cp "$work"/*.deb "$work"/*.buildinfo "$work"/*.changes dist/
changes=$(ls dist/*.changes)

# lintian: errors fail; warnings are printed (as root it also says it
# should not run as root, which is no finding about the packages)
echo "deb: lintian $changes"
rc=0
lintian --fail-on error --tag-display-limit 0 "$changes" >"$work/lintian.log" 2>&1 || rc=$?
grep -v 'running with root privileges' "$work/lintian.log" || true
if [ "$rc" != 0 ]; then
    echo "deb: lintian reports errors (exit $rc)" >&2
    exit 1
fi
echo "deb: the packages are in dist/:"
ls -1 dist/*.deb

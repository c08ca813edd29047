#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# wheel_venv.sh SRC BUILD VENV -- the python.* tests' fixture (ctest
# python.wheel, FIXTURES_SETUP python_venv): a wheel of the package made
# from this build's library and store modules by scripts/wheel.sh -b
# BUILD (as `make wheel` makes one), installed offline into a new plain
# venv (no system site-packages) at VENV. The python.<kind> tests then
# run the suite with VENV/bin/python, without PYTHONPATH or
# DLOCK_LIBRARY: the package and the library are the venv's
# (python/tests/test_installed.py checks it).
#
# pytest is not in a plain venv and cannot be downloaded: for the tests
# only, a .pth file puts Debian's /usr/lib/python3/dist-packages on
# sys.path AFTER the venv's site-packages, so the venv's dlock comes
# first.
#
# Several ctest runs may share a build tree (each runs this fixture): the
# new venv is made in a directory of its own, VENV.XXXXXX/venv, then VENV,
# a symbolic link, is turned to it in one rename, and the venv it named
# before is removed. A run still in an older venv reaches the new one by
# the same paths (a venv's python keeps VENV as its prefix): the same
# files, made from the same build.
set -u
src=$1
build=$2
venv=$3
fail() { echo "FAIL: $*" >&2; exit 1; }
dir=$(mktemp -d "$venv.XXXXXX") || fail "mktemp $venv.XXXXXX"
keep=
trap '[ -n "$keep" ] || rm -rf "$dir"' EXIT

# pip as on a machine without configuration (no find-links or index of
# this one's), offline
while IFS= read -r v; do unset "$v"; done < <(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p')
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset DLOCK_LIBRARY PYTHONPATH

new=$dir/venv
mkdir "$dir/wheel"
wheel=$(bash "$src/scripts/wheel.sh" -b "$build" -o "$dir/wheel") ||
    fail "scripts/wheel.sh -b $build"
[ -f "$wheel" ] || fail "no wheel: $wheel"
case $wheel in
*/libdlock-*-py3-none-linux_*.whl) ;;
*) fail "the wheel's name is not libdlock-<version>-py3-none-linux_<arch>: $wheel" ;;
esac
echo "ok   wheel $(basename "$wheel")"

/usr/bin/python3 -m venv "$new" || fail "python3 -m venv (python3-venv)"
"$new/bin/python" -c 'import sys; assert sys.prefix != sys.base_prefix' ||
    fail "not a venv"
"$new/bin/python" -m pip install --quiet --no-index "$wheel" >"$dir/wheel/pip.log" 2>&1 ||
    { cat "$dir/wheel/pip.log"; fail "pip install --no-index $wheel"; }
site=$("$new/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
[ -f "$site/dlock/_lib/libdlock.so.0" ] || fail "the wheel did not install dlock/_lib/libdlock.so.0"
[ -f "$site/dlock/python.md" ] || fail "the wheel did not install dlock/python.md"
echo "ok   installed into $new"

echo /usr/lib/python3/dist-packages >"$site/zz_debian_dist_packages_for_tests.pth"

# VENV -> the new venv, in one rename; the one before removed
old=$(readlink "$venv" 2>/dev/null) || old=
[ -d "$venv" ] && [ ! -L "$venv" ] && rm -rf "$venv"
ln -s "$(basename "$dir")/venv" "$dir.link" && mv -T "$dir.link" "$venv" ||
    fail "the link $venv"
keep=1
case $old in "$(basename "$venv")".??????/venv) rm -rf "${venv%/*}/${old%/venv}" ;; esac
rm -rf "$venv.wheel"   # this script's place for the wheel before

(cd / && "$venv/bin/python" -c '
import sys, dlock, pytest
assert dlock.__file__.startswith(sys.prefix + "/"), dlock.__file__
assert dlock._native.PATH.startswith(sys.prefix + "/"), dlock._native.PATH
print("ok   the venv imports", dlock.__file__, "over", dlock._native.PATH)
') || fail "the venv does not import its dlock (and pytest)"

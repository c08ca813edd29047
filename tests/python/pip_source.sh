#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# pip_source.sh SRC LIBRARY -- `pip install ./python` as docs/python.md
# gives it for a machine without network: into a new plain venv, from
# the source tree (not a wheel), build isolation on, setuptools and
# wheel from Debian's wheels:
#   pip install --no-index --find-links /usr/share/python-wheels ./python
# then the installed package takes a lock on a file store through
# LIBRARY (DLOCK_LIBRARY), and carries python.md and py.typed, and no
# library of its own (a pure wheel: py3-none-any).
# The tree is copied first (pip builds in the tree, writing build/ and
# *.egg-info there), python/ and docs/python.md with their relative
# places kept: dlock/python.md is a link to ../../docs/python.md, which
# the build must follow.
set -u
src=$1
lib=$2
tmp=$(mktemp -d "${TMPDIR:-/tmp}/dlock-pip-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

while IFS= read -r v; do unset "$v"; done < <(env | sed -n 's/^\(PIP_[A-Z_]*\)=.*/\1/p')
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
unset DLOCK_LIBRARY PYTHONPATH

mkdir -p "$tmp/src/docs"
(cd "$src" && tar -c --exclude=python/build --exclude='python/*.egg-info' \
    --exclude=__pycache__ --exclude=python/dlock/_lib python docs/python.md) |
    (cd "$tmp/src" && tar -x)
[ -L "$tmp/src/python/dlock/python.md" ] || fail "python/dlock/python.md is not a link"
[ -f "$tmp/src/python/dlock/python.md" ] || fail "python/dlock/python.md links nowhere"

/usr/bin/python3 -m venv "$tmp/venv" || fail "python3 -m venv (python3-venv)"
# no index: setuptools and wheel come from /usr/share/python-wheels into
# pip's isolated build environment
(cd "$tmp" && "$tmp/venv/bin/python" -m pip install --no-index \
    --find-links /usr/share/python-wheels ./src/python) >"$tmp/pip.log" 2>&1 ||
    { cat "$tmp/pip.log"; fail "pip install --no-index --find-links /usr/share/python-wheels ./python"; }
grep -q "libdlock-[0-9.]*-py3-none-any.whl" "$tmp/pip.log" ||
    { cat "$tmp/pip.log"; fail "the source did not build a pure py3-none-any wheel"; }
grep -q "Successfully installed libdlock-" "$tmp/pip.log" ||
    { cat "$tmp/pip.log"; fail "pip did not install the distribution libdlock"; }
echo "ok   pip install --no-index --find-links /usr/share/python-wheels ./python"

mkdir "$tmp/locks"
out=$(cd "$tmp" && DLOCK_LIBRARY=$lib "$tmp/venv/bin/python" -c '
import os, sys
import dlock
pkg = os.path.dirname(dlock.__file__)
assert pkg.startswith(sys.prefix + "/"), pkg
md = os.path.join(pkg, "python.md")
assert os.path.isfile(md) and not os.path.islink(md), "no python.md in " + pkg
with open(md) as f:
    assert f.readline().startswith("# dlock for Python"), md
assert os.path.isfile(os.path.join(pkg, "py.typed")), "no py.typed"
assert not os.path.exists(os.path.join(pkg, "_lib")), "a _lib/ in a source install"
assert dlock._native.PATH == sys.argv[1], dlock._native.PATH
with dlock.Client("file://" + sys.argv[2]) as c, c.lock("pip-source") as l:
    print("held, fencing token", l.token)
' "$lib" "$tmp/locks" 2>&1) || fail "the installed package: $out"
case $out in "held, fencing token "[1-9]*) ;; *) fail "unexpected output: $out" ;; esac
echo "ok   the installed package, with python.md: $out"

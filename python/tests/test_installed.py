# SPDX-License-Identifier: MIT
"""The suite runs on the package as users install it: when the tests say
so (DLOCK_PY_INSTALLED=1: the python.<kind> tests, which run in a venv
that tests/python/wheel_venv.sh made from a wheel of the build), the
package, its library and the store modules it loads are the venv's, not
the source tree's nor the build tree's."""
import os
import re
import sys

import pytest

import dlock

pytestmark = pytest.mark.skipif(
    os.environ.get("DLOCK_PY_INSTALLED") != "1",
    reason="not the installed package (DLOCK_PY_INSTALLED=1: the "
           "python.<kind> tests, in a venv with the wheel)")

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def inside(path: str, d: str) -> bool:
    return os.path.realpath(path).startswith(os.path.realpath(d) + os.sep)


def package_dir() -> str:
    return os.path.dirname(os.path.abspath(dlock.__file__))


def mapped() -> "list[str]":
    """The files this process has mapped (/proc/self/maps)."""
    paths = set()
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                paths.add(parts[5].strip())
    return sorted(paths)


def test_the_package_is_the_venvs():
    assert sys.prefix != sys.base_prefix, "not running in a venv"
    venv = os.environ.get("DLOCK_PY_VENV")
    if venv:
        assert os.path.realpath(sys.prefix) == os.path.realpath(venv)
    assert inside(dlock.__file__, sys.prefix), dlock.__file__
    assert not inside(dlock.__file__, SOURCE), dlock.__file__
    assert "DLOCK_LIBRARY" not in os.environ
    # the documentation the docstrings point to ships with it
    assert os.path.isfile(os.path.join(package_dir(), "python.md"))
    assert os.path.isfile(os.path.join(package_dir(), "py.typed"))


def test_the_library_is_the_wheels():
    bundled = os.path.join(package_dir(), "_lib", "libdlock.so.0")
    assert dlock._native.PATH == bundled
    assert not os.path.islink(bundled)
    # /proc/self/maps has the paths resolved (the venv may be reached
    # through a link: tests/python/wheel_venv.sh)
    libs = [p for p in mapped() if re.search(r"/libdlock\.so[.0-9]*$", p)]
    assert libs == [os.path.realpath(bundled)], libs
    assert dlock.library_version() == dlock._native.VERSION


def test_the_store_modules_are_the_wheels(store, client):
    """The client (open on the store under test) loaded its store's
    module from beside the wheel's library, and no other."""
    lib = os.path.join(package_dir(), "_lib")
    mods = [p for p in mapped() if re.search(r"/dlock-[^/]+/[^/]+\.so$", p)]
    for m in mods:
        assert inside(m, lib), "a store module from outside the wheel: " + m
    moddir = os.path.join(lib, "dlock-" + dlock._native.VERSION)
    if store.kind != "file" and os.path.isdir(moddir):
        assert mods, "no store module mapped for %s" % store.kind

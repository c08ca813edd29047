# SPDX-License-Identifier: MIT
"""How the package finds its library, and what it says when it cannot
(docs/python.md, "Installing"); the version written in four places.

Each case imports the source package (a copy, python/dlock) in a
subprocess of its own, with the environment the case needs. ctest runs
this file as python.install with Debian's python3 and DLOCK_LIBRARY set
to the build's library, which the cases copy (and patch); the versions'
test needs no library.
"""
import ctypes
import os
import re
import shutil
import struct
import subprocess
import sys
from typing import Dict, List, Optional

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYDIR = os.path.dirname(HERE)               # python/
ROOT = os.path.dirname(PYDIR)               # the source tree


def read(*path: str) -> str:
    with open(os.path.join(ROOT, *path), encoding="utf-8") as f:
        return f.read()


def one(pattern: str, text: str, what: str) -> str:
    found = re.findall(pattern, text, re.M)
    assert len(found) == 1, "%s: %d matches of %r" % (what, len(found), pattern)
    return str(found[0])


def native(name: str) -> str:
    """A constant of python/dlock/_native.py, read (importing it would
    load a library)."""
    return one(r'^%s = "([^"]*)"' % name, read("python", "dlock", "_native.py"),
               "_native.py's " + name)


VERSION = native("VERSION")
DIST = native("DIST")


def build_library() -> str:
    """The library under test: $DLOCK_LIBRARY (ctest sets it to the
    build's), else build/libdlock.so.0 in the source tree."""
    p = os.environ.get("DLOCK_LIBRARY") or os.path.join(ROOT, "build", "libdlock.so.0")
    if not os.path.isfile(p):
        pytest.skip("no library to test with: set DLOCK_LIBRARY")
    return os.path.realpath(p)


def package(tmp: str, lib: Optional[str] = None) -> str:
    """A copy of the source package under tmp (without dlock/_lib/ and
    caches); with lib, a copy of it as dlock/_lib/libdlock.so.0, as a
    wheel from `make wheel` carries. The directory to put on sys.path."""
    root = os.path.join(tmp, "pkg")
    shutil.copytree(os.path.join(PYDIR, "dlock"), os.path.join(root, "dlock"),
                    ignore=shutil.ignore_patterns("_lib", "__pycache__"),
                    ignore_dangling_symlinks=True)
    if lib:
        os.mkdir(os.path.join(root, "dlock", "_lib"))
        shutil.copyfile(lib, os.path.join(root, "dlock", "_lib", "libdlock.so.0"))
    return root


def env(**changes: Optional[str]) -> Dict[str, str]:
    """This process's environment without DLOCK_LIBRARY and PYTHONPATH,
    LD_LIBRARY_PATH empty, then the changes (None: unset)."""
    e = dict(os.environ)
    e.pop("DLOCK_LIBRARY", None)
    e.pop("PYTHONPATH", None)
    e["LD_LIBRARY_PATH"] = ""
    for k, v in changes.items():
        if v is None:
            e.pop(k, None)
        else:
            e[k] = v
    return e


def run(code: str, args: List[str], e: Dict[str, str], cwd: str) -> "subprocess.CompletedProcess[str]":
    """python -E -s -c code args...: no PYTHON* variables, no user
    site-packages (-E: sys.path gets the package through the code)."""
    return subprocess.run([sys.executable, "-E", "-s", "-c", code] + args,
                          env=e, cwd=cwd, capture_output=True, text=True,
                          timeout=60)


IMPORT = "import sys; sys.path.insert(0, sys.argv[1]); import dlock; print(dlock._native.PATH)"


def test_the_versions_agree():
    """pyproject.toml, _native.VERSION, CMakeLists.txt's project() and
    dlock.h's DLOCK_VERSION_STRING say one version; the distribution's
    name is _native.DIST."""
    pyproject = read("python", "pyproject.toml")
    project = pyproject.split("[project]", 1)[1].split("\n[", 1)[0]
    py_version = one(r'^version\s*=\s*"([^"]*)"', project, "pyproject.toml's version")
    name = one(r'^name\s*=\s*"([^"]*)"', project, "pyproject.toml's name")
    cmake = one(r"^project\(dlock\s+VERSION\s+([0-9.]+)", read("CMakeLists.txt"),
                "CMakeLists.txt's project()")
    h = read("include", "dlock.h")
    header = one(r'^#define DLOCK_VERSION_STRING "([^"]*)"', h, "DLOCK_VERSION_STRING")
    parts = [one(r"^#define DLOCK_VERSION_%s (\d+)" % p, h, "DLOCK_VERSION_" + p)
             for p in ("MAJOR", "MINOR", "PATCH")]
    versions = {"python/pyproject.toml": py_version,
                "python/dlock/_native.py VERSION": VERSION,
                "CMakeLists.txt project()": cmake,
                "include/dlock.h DLOCK_VERSION_STRING": header,
                "include/dlock.h DLOCK_VERSION_MAJOR.MINOR.PATCH": ".".join(parts)}
    assert len(set(versions.values())) == 1, versions
    assert name == DIST, (name, DIST)


def test_the_library_is_of_that_version():
    lib = ctypes.CDLL(build_library())
    lib.dlock_version.restype = ctypes.c_char_p
    assert lib.dlock_version().decode() == VERSION


def test_without_a_library_the_import_says_what_to_install(tmp_path):
    """No DLOCK_LIBRARY, no dlock/_lib/, nothing on LD_LIBRARY_PATH and
    no system libdlock: ImportError, naming what to install."""
    tmp = str(tmp_path)
    root = package(tmp)
    e = env()
    probe = run("import ctypes; ctypes.CDLL('libdlock.so.0')", [], e, tmp)
    if probe.returncode == 0:
        pytest.skip("this machine has a libdlock.so.0 the dynamic linker finds "
                    "(the Debian package libdlock0, or make install)")
    r = run(IMPORT, [root], e, tmp)
    assert r.returncode != 0, r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: "), r.stderr
    for words in ("libdlock.so.0", "apt install libdlock0",
                  "pip install " + DIST, "DLOCK_LIBRARY"):
        assert words in last, "%r not in %r" % (words, last)


def test_a_missing_dlock_library_is_named(tmp_path):
    tmp = str(tmp_path)
    root = package(tmp, build_library())
    missing = os.path.join(tmp, "nowhere", "libdlock.so.0")
    r = run(IMPORT, [root], env(DLOCK_LIBRARY=missing), tmp)
    assert r.returncode != 0, r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: ") and missing in last, r.stderr


def elf_offset(data: bytes, vaddr: int) -> int:
    """The file offset of a virtual address of an ELF64 little-endian
    shared object (its PT_LOAD program headers)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        pytest.skip("not an ELF64 little-endian library")
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, p_vaddr, _, p_filesz, _, _ = struct.unpack_from(
            "<IIQQQQQQ", data, phoff + i * phentsize)
        if p_type == 1 and p_vaddr <= vaddr < p_vaddr + p_filesz:  # PT_LOAD
            return vaddr - p_vaddr + p_offset
    raise AssertionError("address %#x is in no PT_LOAD segment" % vaddr)


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def other_version_library(lib: str, dest: str) -> str:
    """A copy of lib at dest whose dlock_version() says another version
    of the same length: the bytes dlock_version() returns (found through
    dladdr() and the ELF program headers, so that the patch is where
    the function reads), "0.1.0" made "0.1.9". Returns that version."""
    dll = ctypes.CDLL(lib)
    dll.dlock_version.restype = ctypes.c_void_p
    ptr = dll.dlock_version()
    info = DlInfo()
    libc = ctypes.CDLL(None)
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    assert libc.dladdr(ptr, ctypes.byref(info)), "dladdr"
    with open(lib, "rb") as f:
        data = bytearray(f.read())
    off = elf_offset(bytes(data), ptr - info.dli_fbase)
    old = VERSION.encode() + b"\0"
    assert bytes(data[off:off + len(old)]) == old, (
        "dlock_version()'s bytes at file offset %#x: %r" % (off, bytes(data[off:off + 16])))
    other = VERSION[:-1] + ("9" if VERSION[-1] != "9" else "8")
    data[off:off + len(old)] = other.encode() + b"\0"
    with open(dest, "wb") as f:
        f.write(data)
    return other


def test_a_library_of_another_version_is_refused(tmp_path):
    """DLOCK_LIBRARY naming a libdlock of another version: ImportError
    naming both versions and the library."""
    tmp = str(tmp_path)
    root = package(tmp)
    patched = os.path.join(tmp, "libdlock.so.0")
    other = other_version_library(build_library(), patched)
    # the patch is the one dlock_version() reads
    r = run("import ctypes, sys; l = ctypes.CDLL(sys.argv[1]); "
            "l.dlock_version.restype = ctypes.c_char_p; "
            "print(l.dlock_version().decode())", [patched], env(), tmp)
    assert r.returncode == 0 and r.stdout.strip() == other, (r.stdout, r.stderr)
    r = run(IMPORT, [root], env(DLOCK_LIBRARY=patched), tmp)
    assert r.returncode != 0, r.stdout
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: "), r.stderr
    for words in (patched, "version " + other, "version " + VERSION, DIST):
        assert words in last, "%r not in %r" % (words, last)


def test_the_places_in_order(tmp_path):
    """$DLOCK_LIBRARY before the package's dlock/_lib/libdlock.so.0,
    that before the dynamic linker's libdlock.so.0 (here through
    LD_LIBRARY_PATH, as a system-wide install through its cache)."""
    tmp = str(tmp_path)
    lib = build_library()
    bundled_root = package(os.path.join(tmp, "a"), lib)
    bundled = os.path.join(bundled_root, "dlock", "_lib", "libdlock.so.0")
    plain_root = package(os.path.join(tmp, "b"))
    patched = os.path.join(tmp, "libdlock.so.0")
    other = other_version_library(lib, patched)
    # 1. DLOCK_LIBRARY wins over the package's copy (refused: it is the
    # other version)
    r = run(IMPORT, [bundled_root], env(DLOCK_LIBRARY=patched), tmp)
    assert r.returncode != 0 and patched in r.stderr and other in r.stderr, r.stderr
    # 2. the package's copy wins over the linker's search path (which
    # here finds the other version)
    r = run(IMPORT, [bundled_root], env(LD_LIBRARY_PATH=tmp), tmp)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == bundled
    # 3. without either, the linker's libdlock.so.0
    r = run(IMPORT, [plain_root], env(LD_LIBRARY_PATH=os.path.dirname(lib)), tmp)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "libdlock.so.0"

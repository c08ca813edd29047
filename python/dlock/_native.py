# SPDX-License-Identifier: MIT
"""The C library, loaded with ctypes (docs/python.md, "How the package
finds the library").

ctypes is part of CPython: the package needs nothing installed beside it,
so a wheel installs offline into any venv. (cffi's ABI mode would do the
same work and must itself be installed first.) The structures below
repeat include/dlock.h's; python/tests/test_abi.py compares their sizes and
offsets with a C compiler's.

The library is found, in order:
  1. ``$DLOCK_LIBRARY``, a path (tests, a build tree);
  2. the copy inside the package (``dlock/_lib/libdlock.so.0``, which a
     wheel from ``make wheel`` carries, its store modules beside it);
  3. the system's: ``libdlock.so.0`` by the dynamic linker's search (the
     Debian package libdlock0, or ``make install`` with ldconfig).
Its version must be the package's (``VERSION``): another is refused at
import, naming both.
"""
import ctypes
import os
from ctypes import (CFUNCTYPE, POINTER, Structure, c_char, c_char_p, c_int,
                    c_int64, c_size_t, c_uint, c_uint64, c_void_p)
from typing import Any, Optional

# the package's version, which the library's must equal (pyproject.toml
# and CMakeLists.txt say the same: python/tests/test_install.py)
VERSION = "0.1.0"
# the distribution's name on PyPI (the import name is dlock)
DIST = "libdlock"


class ClientOptions(Structure):
    _fields_ = [("timeout_ms", c_int64)]


LOST_CB = CFUNCTYPE(None, c_void_p, c_uint64, c_void_p)


class Options(Structure):
    _fields_ = [("ttl_ms", c_int64), ("flags", c_uint),
                ("on_lost", LOST_CB), ("on_lost_arg", c_void_p),
                ("permits", c_uint), ("at_least_ms", c_int64),
                ("at_most_ms", c_int64)]


class Info(Structure):
    _fields_ = [("held", c_int), ("holder", c_char * 256),
                ("token", c_uint64), ("ttl_ms", c_int64),
                ("held_ms", c_int64), ("waiters", c_int64),
                ("queue", POINTER(c_char_p)), ("queue_len", c_size_t),
                ("holders", c_int64), ("shared", c_int),
                ("permits", c_int64), ("foreign", c_char * 256)]


class Listed(Structure):
    _fields_ = [("name", c_char_p), ("info", Info)]


class ListPage(Structure):
    _fields_ = [("locks", POINTER(Listed)), ("n", c_size_t),
                ("next", c_void_p)]


class Finding(Structure):
    _fields_ = [("check", c_char * 32), ("what", c_char * 512),
                ("fix", c_char * 512)]


class Check(Structure):
    _fields_ = [("findings", POINTER(Finding)), ("n", c_size_t),
                ("round_trip_us", c_int64), ("clock_offset_ms", c_int64),
                ("notes", c_char * 1024)]


class LeaderC(Structure):
    _fields_ = [("present", c_int), ("term", c_uint64),
                ("value", c_char * 256), ("ttl_ms", c_int64),
                ("error", c_int), ("why", c_char * 256)]


P = c_void_p  # an opaque handle: dlock_client *, dlock *, dlock_observer *
PP = POINTER(c_void_p)

# name: (restype, argtypes)
_SIGNATURES = {
    "dlock_client_open": (c_int, [PP, c_char_p, POINTER(ClientOptions)]),
    "dlock_client_close": (None, [P]),
    "dlock_client_store": (c_char_p, [P]),
    "dlock_open": (c_int, [PP, P, c_char_p, POINTER(Options)]),
    "dlock_acquire": (c_int, [P, c_int64]),
    "dlock_acquire_shared": (c_int, [P, c_int64]),
    "dlock_release": (c_int, [P]),
    "dlock_acquire_all": (c_int, [PP, c_size_t, c_int64]),
    "dlock_release_all": (c_int, [PP, c_size_t]),
    "dlock_cancel": (c_int, [P]),
    "dlock_shutdown": (c_int, [P]),
    "dlock_extend": (c_int, [P, c_int64]),
    "dlock_token": (c_uint64, [P]),
    "dlock_held": (c_int, [P]),
    "dlock_name": (c_char_p, [P]),
    "dlock_close": (None, [P]),
    "dlock_inspect": (c_int, [P, c_char_p, POINTER(Info)]),
    "dlock_info_clear": (None, [POINTER(Info)]),
    "dlock_list": (c_int, [P, c_char_p, c_char_p, c_size_t, c_uint,
                           POINTER(ListPage)]),
    "dlock_list_clear": (None, [POINTER(ListPage)]),
    "dlock_break": (c_int, [P, c_char_p, POINTER(Info)]),
    "dlock_client_check": (c_int, [P, c_int64, POINTER(Check)]),
    "dlock_check_clear": (None, [POINTER(Check)]),
    "dlock_campaign": (c_int, [P, c_char_p, c_int64]),
    "dlock_proclaim": (c_int, [P, c_char_p]),
    "dlock_resign": (c_int, [P]),
    "dlock_leader_get": (c_int, [P, c_char_p, POINTER(LeaderC)]),
    "dlock_observe": (c_int, [P, c_char_p, c_void_p, c_void_p, PP]),
    "dlock_observer_fd": (c_int, [P]),
    "dlock_observer_read": (c_int, [P, POINTER(LeaderC)]),
    "dlock_observer_close": (None, [P]),
    "dlock_strerror": (c_char_p, [c_int]),
    "dlock_errname": (c_char_p, [c_int]),
    "dlock_errmsg": (c_char_p, []),
    "dlock_version": (c_char_p, []),
    "dlock_store_scheme": (c_char_p, [c_size_t, POINTER(c_int)]),
}


def _bundled() -> Optional[str]:
    p = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_lib",
                     "libdlock.so.0")
    return p if os.path.exists(p) else None


def _load() -> "tuple[Any, str]":
    path = os.environ.get("DLOCK_LIBRARY") or _bundled() or "libdlock.so.0"
    try:
        dll = ctypes.CDLL(path)
    except OSError as e:
        raise ImportError(
            "dlock: the C library %s could not be loaded (%s). Install it: "
            "`apt install libdlock0` (Debian packages: docs/install.md), "
            "`make install` from the source tree, or `pip install %s` "
            "from a wheel that carries it (`make wheel`); or set "
            "DLOCK_LIBRARY to its path" % (path, e, DIST)) from None
    for name, (res, args) in _SIGNATURES.items():
        try:
            fn = getattr(dll, name)
        except AttributeError:
            raise ImportError(
                "dlock: the C library %s has no %s(): it is older than "
                "this package (%s %s); install the library of the same "
                "version" % (path, name, DIST, VERSION)) from None
        fn.restype = res
        fn.argtypes = args
    got = dll.dlock_version().decode()
    if got != VERSION:
        raise ImportError(
            "dlock: the C library %s is version %s, but this Python "
            "package (%s) is version %s: install the two of the same "
            "version (or set DLOCK_LIBRARY to a libdlock.so.0 of %s)"
            % (path, got, DIST, VERSION, VERSION))
    return dll, path


lib: Any
PATH: str  # the library loaded
lib, PATH = _load()


def text(b: Optional[bytes]) -> str:
    """A C string the library gave (bytes; None for NULL) as str."""
    return "" if b is None else b.decode("utf-8", "replace")


def errmsg() -> str:
    """The calling thread's last message of the library."""
    return text(lib.dlock_errmsg())


def handles(hs: "list[Any]") -> Any:
    """An array of handles (dlock *const *), for the *_all() calls."""
    return (c_void_p * len(hs))(*hs)


# flags and codes (include/dlock.h; never renumbered)
NO_RENEW = 0x1
FAIR = 0x2
NOT_REENTRANT = 0x4
OWNER_HANDLE = 0x8
LIST_FREE = 0x1
EOK, EBUSY, ELOST, ENOTHELD, EINVAL, ECONN = 0, -1, -2, -3, -4, -5
EAUTH, EPROTO, ENOMEM, ENOTSUP, EDEADLK = -6, -7, -8, -9, -10
ECANCELED = -11
# the longest lease and wait, in ms: include/dlock.h's DLOCK_TTL_MAX and
# DLOCK_WAIT_MAX (365 days). ctypes reads no header, so they are
# repeated here; tests/test_limits.py checks them against the header.
TTL_MAX_MS = 31536000000
WAIT_MAX_MS = 31536000000

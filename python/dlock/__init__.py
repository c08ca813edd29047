# SPDX-License-Identifier: MIT
"""dlock: distributed locks over the stores you already run.

    import dlock
    with dlock.Client("redis://127.0.0.1:6379") as client:
        with client.lock("payments:42", ttl=30) as lock:
            write_with_fence(lock.token)

The whole API: python.md beside this file (docs/python.md in the source
tree).
"""
import ctypes
from typing import Dict

from ._client import (TTL_MAX, WAIT_MAX, CheckReport, Client, Finding,
                      Info, Lock, LockSet, RWLock)
from ._elect import Election, Leader, Observer
from ._errors import (AuthenticationFailed, Busy, Cancelled, Closed,
                      ConnectionFailed, Deadlock,
                      DlockError, ForkedClient, InvalidArgument, LockLost,
                      NotHeld, NotSupported, OutOfMemory, ProtocolError)
from ._native import VERSION as __version__
from ._native import lib as _lib
from ._native import text as _text

__all__ = [
    "Client", "Lock", "LockSet", "RWLock", "Info", "CheckReport", "Finding",
    "Election", "Leader", "Observer", "DlockError", "Busy", "LockLost",
    "NotHeld", "InvalidArgument", "ForkedClient", "ConnectionFailed",
    "AuthenticationFailed", "ProtocolError", "OutOfMemory", "NotSupported",
    "Deadlock", "Cancelled", "Closed", "library_version", "stores",
    "TTL_MAX", "WAIT_MAX",
]


def library_version() -> str:
    """The C library's version ("0.1.0")."""
    return _text(_lib.dlock_version())


def stores() -> Dict[str, str]:
    """The URI schemes the library knows: "builtin", "module" (installed,
    loaded on first use) or "missing"."""
    out: Dict[str, str] = {}
    how = ctypes.c_int()
    i = 0
    while True:
        s = _lib.dlock_store_scheme(i, ctypes.byref(how))
        if s is None:
            return out
        out[_text(s)] = {1: "builtin", 2: "module"}.get(how.value, "missing")
        i += 1

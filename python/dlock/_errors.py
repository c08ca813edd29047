# SPDX-License-Identifier: MIT
"""Exceptions: one class per DLOCK_E* code, with the library's message."""
from typing import Dict, Optional, Type

from ._native import errmsg, lib, text


class DlockError(Exception):
    """A dlock call failed. ``code`` is the C library's DLOCK_E* number,
    ``name`` its name ("DLOCK_ECONN"), ``message`` the library's words
    (never containing a password)."""

    code = 0

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message

    @property
    def name(self) -> str:
        return text(lib.dlock_errname(self.code))


class Busy(DlockError, TimeoutError):
    """DLOCK_EBUSY: another owner held the lock for the whole wait (raised
    by ``with lock:`` when its ``timeout`` ran out; ``acquire()`` returns
    False instead). A TimeoutError, as a timed-out wait is elsewhere in
    Python (``except TimeoutError`` catches it)."""

    code = -1


class LockLost(DlockError):
    """DLOCK_ELOST: the hold expired or was taken over while it was held.
    The critical section was not protected: roll back. ``token`` is the
    lost hold's fencing token when known."""

    code = -2
    token = 0


class NotHeld(DlockError, RuntimeError):
    """DLOCK_ENOTHELD: release() by an owner that holds no such lock."""

    code = -3


class InvalidArgument(DlockError, ValueError):
    """DLOCK_EINVAL: a bad name, URI, duration, or a closed client."""

    code = -4


class ForkedClient(InvalidArgument):
    """The client was opened in another process (before fork()): a child
    must open its own."""


class Closed(InvalidArgument):
    """The Client or Lock is closed: by an earlier close(), or by a close()
    (of the lock, or of its client) while this call waited, which ends the
    wait at once, as a cancel does. DLOCK_EINVAL, as the C library's calls
    on a closed client; a ValueError, as I/O on a closed file."""


class ConnectionFailed(DlockError, ConnectionError):
    """DLOCK_ECONN: the store is unreachable or the link broke."""

    code = -5


class AuthenticationFailed(DlockError, PermissionError):
    """DLOCK_EAUTH: the store refused the credentials."""

    code = -6


class ProtocolError(DlockError):
    """DLOCK_EPROTO: the store answered something unexpected."""

    code = -7


class OutOfMemory(DlockError, MemoryError):
    """DLOCK_ENOMEM."""

    code = -8


class NotSupported(DlockError, NotImplementedError):
    """DLOCK_ENOTSUP: a store or an operation this build or store lacks."""

    code = -9


class Deadlock(DlockError):
    """DLOCK_EDEADLK: the request would wait for the caller itself (a read
    hold asking to become a write hold)."""

    code = -10


class Cancelled(DlockError):
    """DLOCK_ECANCELED: dlock_cancel() ended the wait (the asyncio layer
    turns it into the task's own CancelledError)."""

    code = -11


# every class above that names a code of its own (its subclasses, such as
# Closed, share their parent's); tests/docs/check_errors.py checks that
# each code of include/dlock.h's DLOCK_ERRNO_MAP has one
_BY_CODE: Dict[int, Type[DlockError]] = {
    c.code: c
    for c in list(globals().values())
    if isinstance(c, type) and issubclass(c, DlockError)
    and c is not DlockError and "code" in vars(c)
}


def error(rc: int) -> DlockError:
    """The exception for return code ``rc``, with the calling thread's
    dlock_errmsg() (read at once: the same OS thread made the call)."""
    msg = errmsg()
    if not msg:
        msg = text(lib.dlock_strerror(rc))
    cls = _BY_CODE.get(rc, DlockError)
    return cls(msg, rc)


def check(rc: int) -> None:
    if rc != 0:
        raise error(rc)

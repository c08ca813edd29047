# SPDX-License-Identifier: MIT
"""Client and Lock: the C API, the Python way (docs/python.md)."""
import math
import os
import threading
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

from . import _aio
from . import _native as N
from ._errors import (Busy, ForkedClient, InvalidArgument, LockLost, check,
                      error)
from ._native import ffi, lib

Name = Union[str, bytes]
LostCallback = Callable[["Lock", int], Any]

# set while a lost-lock callback runs on a client's background thread: a
# handle dropped there is closed later (dlock_close() must not run there)
_in_callback = threading.local()


def _ms(seconds: Optional[float], what: str, forever: bool) -> int:
    """Seconds (None: forever, when allowed) to the C library's ms."""
    if seconds is None:
        if forever:
            return -1
        raise InvalidArgument("%s must be a number of seconds" % what, N.EINVAL)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgument("%s must be a number of seconds, not %r"
                              % (what, seconds), N.EINVAL)
    if forever and seconds == -1:
        return -1
    if seconds < 0 or math.isnan(seconds) or math.isinf(seconds):
        raise InvalidArgument("%s must be >= 0 seconds%s, not %r"
                              % (what, " (or None: forever)" if forever else "",
                                 seconds), N.EINVAL)
    return int(math.ceil(seconds * 1000))


def _name(name: Name) -> bytes:
    if isinstance(name, str):
        return name.encode("utf-8")
    if isinstance(name, (bytes, bytearray)):
        return bytes(name)
    raise InvalidArgument("a lock name is str or bytes, not %s"
                          % type(name).__name__, N.EINVAL)


def _error_of(rc: int, msg: str) -> Exception:
    """The exception of code rc with a message read elsewhere (a worker
    thread's dlock_errmsg())."""
    from ._errors import _BY_CODE, DlockError
    return _BY_CODE.get(rc, DlockError)(msg, rc)


def _text(b: bytes) -> Union[str, bytes]:
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


@dataclass(frozen=True)
class Info:
    """What the store knows about one lock (``Client.inspect()``)."""

    held: bool
    holder: str  # "host pid N tid N" of the holder, "" when free
    token: int  # the holder's fencing token; when free, the last one issued
    ttl: Optional[float]  # seconds of lease left; None: free or no leases
    held_for: Optional[float]  # how long the hold has lasted; None: unknown
    waiters: Optional[int]  # None: the store cannot tell
    queue: List[str] = field(default_factory=list)  # the fair queue, in order
    holders: int = 0  # 0 free, 1 an exclusive holder, or read holds/permits
    shared: bool = False  # the holds are read holds
    permits: int = 0  # a semaphore's permits; 0: a lock

    @staticmethod
    def _from(ci: Any) -> "Info":
        return Info(
            held=bool(ci.held),
            holder=ffi.string(ci.holder).decode("utf-8", "replace"),
            token=int(ci.token),
            ttl=None if ci.ttl_ms < 0 else ci.ttl_ms / 1000.0,
            held_for=None if ci.held_ms < 0 else ci.held_ms / 1000.0,
            waiters=None if ci.waiters < 0 else int(ci.waiters),
            queue=[ffi.string(ci.queue[i]).decode("utf-8", "replace")
                   for i in range(ci.queue_len)],
            holders=int(ci.holders),
            shared=bool(ci.shared),
            permits=int(ci.permits),
        )


class Client:
    """Connections to one store and one background thread (renewals,
    wake-ups), shared by every lock made through it and by threads.

    ``uri``: a store URI (docs/stores.md); None or "" means $DLOCK_STORE,
    else the local file store. ``timeout``: the longest one store round
    trip may take, in seconds (default 2). Use as a context manager, or
    call close(). A client must not be used in a child process after
    fork(): ForkedClient; open a new one there.
    """

    def __init__(self, uri: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        self._c = ffi.NULL
        self._pid = os.getpid()
        self._workers: Optional[_aio.Workers] = None
        # handles dropped inside their own lost-lock callback, each with its
        # cffi callback (kept alive until the handle is closed)
        self._deferred: List[Tuple[Any, Any]] = []
        opts = ffi.new("dlock_client_options *")
        if timeout is not None:
            opts.timeout_ms = _ms(timeout, "timeout", False)
            if opts.timeout_ms == 0:
                raise InvalidArgument("timeout must be > 0 seconds", N.EINVAL)
        out = ffi.new("dlock_client **")
        rc = lib.dlock_client_open(out, (uri or "").encode("utf-8"), opts)
        check(rc)
        self._c = out[0]

    # -- life --
    def _check(self) -> Any:
        if self._pid != os.getpid():
            raise ForkedClient(
                "this client was opened in process %d, before a fork(): a "
                "child must open its own client" % self._pid, N.EINVAL)
        if self._c == ffi.NULL:
            raise InvalidArgument("the client is closed", N.EINVAL)
        while self._deferred:
            lib.dlock_close(self._deferred.pop()[0])
        return self._c

    def close(self) -> None:
        """Stops the background thread, releases every hold still made
        through this client (best effort) and closes its connections. Locks
        made through it then raise InvalidArgument. In a forked child it
        touches nothing of the parent's."""
        if self._c == ffi.NULL:
            return
        c, self._c = self._c, ffi.NULL
        if self._pid != os.getpid():
            return
        while self._deferred:
            lib.dlock_close(self._deferred.pop()[0])
        lib.dlock_client_close(c)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    @property
    def store(self) -> str:
        """The store URI, with any password replaced by ***."""
        return str(ffi.string(lib.dlock_client_store(self._check())).decode())

    def __repr__(self) -> str:
        if self._c == ffi.NULL:
            return "<dlock.Client closed>"
        return "<dlock.Client %s>" % ffi.string(
            lib.dlock_client_store(self._c)).decode()

    def _aio_workers(self) -> "_aio.Workers":
        if self._workers is None:
            self._workers = _aio.Workers()
        return self._workers

    # -- locks --
    def lock(self, name: Name, ttl: Optional[float] = None, *,
             fair: bool = False, renew: bool = True, reentrant: bool = True,
             timeout: Optional[float] = None,
             on_lost: Optional[LostCallback] = None,
             owner: str = "thread") -> "Lock":
        """A lock called ``name`` (str, as UTF-8, or bytes). ``ttl``: the
        lease in seconds (default 30), renewed every ttl/3 while held
        unless ``renew=False``. ``fair``: first come, first served.
        ``timeout``: how long ``with lock:`` waits (None: as long as it
        takes). ``on_lost(lock, token)`` runs on the client's background
        thread when a hold is found lost; it must return quickly.
        ``owner``: "thread" (each thread its own hold, as in C) or "lock"
        (the Lock object is the owner: any thread may release it)."""
        return Lock(self, name, ttl, fair=fair, renew=renew,
                    reentrant=reentrant, timeout=timeout, on_lost=on_lost,
                    owner=owner)

    def rwlock(self, name: Name, ttl: Optional[float] = None, *,
               renew: bool = True, timeout: Optional[float] = None,
               on_lost: Optional[LostCallback] = None) -> "RWLock":
        """A read-write lock: ``rw.read`` (shared holds) and ``rw.write``
        (the exclusive hold), each a context manager."""
        return RWLock(Lock(self, name, ttl, renew=renew, timeout=timeout,
                           on_lost=on_lost))

    def semaphore(self, name: Name, permits: int,
                  ttl: Optional[float] = None, *, renew: bool = True,
                  timeout: Optional[float] = None,
                  on_lost: Optional[LostCallback] = None) -> "Lock":
        """A counting semaphore of ``permits``: each acquire takes one.
        Every user of the name must give the same ``permits``."""
        if isinstance(permits, bool) or not isinstance(permits, int) \
                or permits < 1:
            raise InvalidArgument("permits must be an int >= 1, not %r"
                                  % (permits,), N.EINVAL)
        return Lock(self, name, ttl, renew=renew, timeout=timeout,
                    on_lost=on_lost, permits=permits)

    # -- looking at the store --
    def inspect(self, name: Name) -> Info:
        """What the store knows about lock ``name`` (one round trip)."""
        ci = ffi.new("dlock_info *")
        check(lib.dlock_inspect(self._check(), _name(name), ci))
        try:
            return Info._from(ci)
        finally:
            lib.dlock_info_clear(ci)

    def list(self, prefix: Name = "", *, free: bool = False,
             page: int = 100) -> Iterator[Tuple[Union[str, bytes], Info]]:
        """The locks held or waited for (``free=True``: every lock the
        store keeps) whose names start with ``prefix``, as (name, Info),
        a page of ``page`` at a time. A name that is not UTF-8 is bytes."""
        cursor = ffi.NULL
        keep = None
        while True:
            p = ffi.new("dlock_list_page *")
            check(lib.dlock_list(self._check(), _name(prefix), cursor, page,
                                 N.LIST_FREE if free else 0, p))
            try:
                got = [(_text(ffi.string(p.locks[i].name)),
                        Info._from(p.locks[i].info)) for i in range(p.n)]
                keep = ffi.new("char[]", ffi.string(p.next)) \
                    if p.next != ffi.NULL else None
            finally:
                lib.dlock_list_clear(p)
            yield from got
            if keep is None:
                return
            cursor = keep

    def break_lock(self, name: Name) -> Info:
        """Breaks a stuck lock (an operator's command): removes every hold
        of it and wakes its waiters; the evicted holders learn at their
        next renewal. Returns what was evicted."""
        ci = ffi.new("dlock_info *")
        check(lib.dlock_break(self._check(), _name(name), ci))
        try:
            return Info._from(ci)
        finally:
            lib.dlock_info_clear(ci)


class Lock:
    """A named lock of one client. By default each thread is its own owner
    (as in the C library): a thread acquires and releases its own hold, and
    may re-enter it. With ``owner="lock"`` the Lock object is the owner:
    one hold, which any thread may release (one acquire at a time).
    Works as ``with lock:``. Made by ``Client.lock()``."""

    def __init__(self, client: Client, name: Name, ttl: Optional[float],
                 *, fair: bool = False, renew: bool = True,
                 reentrant: bool = True, timeout: Optional[float] = None,
                 on_lost: Optional[LostCallback] = None,
                 permits: int = 0, owner: str = "thread") -> None:
        self._l = ffi.NULL
        if owner not in ("thread", "lock"):
            raise InvalidArgument('owner must be "thread" or "lock", not %r'
                                  % (owner,), N.EINVAL)
        self._client = client
        self._timeout = _ms(timeout, "timeout", True)
        self._on_lost = on_lost
        opts = ffi.new("dlock_options *")
        if ttl is not None:
            opts.ttl_ms = _ms(ttl, "ttl", False)
            if opts.ttl_ms == 0:
                raise InvalidArgument("ttl must be > 0 seconds", N.EINVAL)
        opts.flags = ((0 if renew else N.NO_RENEW) | (N.FAIR if fair else 0)
                      | (0 if reentrant else N.NOT_REENTRANT)
                      | (N.OWNER_HANDLE if owner == "lock" else 0))
        opts.permits = permits
        # the owner's token, for LockLost: per thread, or the lock's own
        self._tls: Any = (threading.local() if owner == "thread"
                          else types.SimpleNamespace(token=0))
        self._cb = None
        if on_lost is not None:
            if not callable(on_lost):
                raise InvalidArgument("on_lost must be callable", N.EINVAL)
            self._cb = ffi.callback("void(dlock *, uint64_t, void *)",
                                    self._lost)
            opts.on_lost = self._cb
        out = ffi.new("dlock **")
        check(lib.dlock_open(out, client._check(), _name(name), opts))
        self._l = out[0]
        self._name = _name(name)
        self._opts = opts  # for the handles of asyncio tasks
        self._tasks = _aio.TaskHolds()

    def _lost(self, _l: Any, token: int, _arg: Any) -> None:
        # on the client's background thread
        _in_callback.on = True
        try:
            if self._on_lost is not None:
                self._on_lost(self, int(token))
        finally:
            _in_callback.on = False

    def _h(self) -> Any:
        self._client._check()
        if self._l == ffi.NULL:
            raise InvalidArgument("the lock is closed", N.EINVAL)
        return self._l

    @property
    def name(self) -> Union[str, bytes]:
        return _text(self._name)

    def acquire(self, timeout: Optional[float] = None, *,
                blocking: bool = True) -> bool:
        """Acquires the lock for the calling thread: True when it holds it,
        False when another owner held it for the whole wait. ``timeout``:
        None waits as long as it takes, 0 tries once, else at most that
        many seconds (``blocking=False`` is ``timeout=0``). Waiting is
        woken by the store and releases the GIL. Raises LockLost when the
        thread's earlier hold was lost and not yet released, and the
        store's errors (ConnectionFailed, ...)."""
        wait = 0 if not blocking else _ms(timeout, "timeout", True)
        rc = lib.dlock_acquire(self._h(), wait)
        if rc == N.EBUSY:
            return False
        check(rc)
        self._tls.token = int(lib.dlock_token(self._l))
        return True

    def acquire_shared(self, timeout: Optional[float] = None, *,
                       blocking: bool = True) -> bool:
        """A shared (read) hold for the calling thread, as acquire()."""
        wait = 0 if not blocking else _ms(timeout, "timeout", True)
        rc = lib.dlock_acquire_shared(self._h(), wait)
        if rc == N.EBUSY:
            return False
        check(rc)
        self._tls.token = int(lib.dlock_token(self._l))
        return True

    def release(self) -> None:
        """Releases one level of the calling thread's hold. Raises LockLost
        when the hold had been lost: the critical section was not
        protected (roll back). NotHeld when the thread holds no such
        lock."""
        rc = lib.dlock_release(self._h())
        if rc == N.ELOST:
            e = error(rc)
            assert isinstance(e, LockLost)
            e.token = getattr(self._tls, "token", 0)
            self._tls.token = 0
            raise e
        check(rc)
        if lib.dlock_held(self._l) == 0:
            self._tls.token = 0

    def extend(self, ttl: float) -> None:
        """Sets the calling thread's lease to ``ttl`` seconds from now (and
        makes it the lease the watchdog renews to)."""
        check(lib.dlock_extend(self._h(), _ms(ttl, "ttl", False)))

    def _mine(self) -> Any:
        """The handle of the caller's hold: its asyncio task's, inside a
        task that holds through this lock, else the thread's."""
        h = self._h()
        t = self._tasks.current()
        return t[0] if t is not None else h

    @property
    def token(self) -> int:
        """The fencing token of the caller's hold (0: none): the calling
        thread's, or inside an asyncio task that holds it, the task's."""
        return int(lib.dlock_token(self._mine()))

    @property
    def held(self) -> bool:
        """Whether the caller (thread, or asyncio task) holds the lock and
        has not lost it."""
        return bool(lib.dlock_held(self._mine()) > 0)

    @property
    def lost(self) -> bool:
        """Whether the caller's hold was lost and awaits release()."""
        return bool(lib.dlock_held(self._mine()) == N.ELOST)

    @property
    def hold_count(self) -> int:
        """The caller's reentrant hold count (0: not held)."""
        return max(0, int(lib.dlock_held(self._mine())))

    # -- asyncio: each task an owner (_aio.py) --
    def _task_entry(self) -> List[Any]:
        import asyncio
        task = asyncio.current_task()
        if task is None:
            raise InvalidArgument("the async methods run inside an asyncio "
                                  "task", N.EINVAL)
        self._h()
        e = self._tasks.by_task.get(task)
        if e is None:
            opts = ffi.new("dlock_options *", self._opts[0])
            opts.flags |= N.OWNER_HANDLE
            out = ffi.new("dlock **")
            check(lib.dlock_open(out, self._client._check(), self._name,
                                 opts))
            e = [out[0], 0, 0]  # handle, hold count, token
            self._tasks.by_task[task] = e
        return e

    def _task_done(self, e: List[Any]) -> None:
        if e[1] == 0:
            for t, v in list(self._tasks.by_task.items()):
                if v is e:
                    del self._tasks.by_task[t]
            lib.dlock_close(e[0])

    async def _acquire_async(self, what: str, timeout: Optional[float],
                             blocking: bool) -> bool:
        wait = 0 if not blocking else _ms(timeout, "timeout", True)
        e = self._task_entry()
        try:
            rc, msg, tok = await _aio.run(self._client._aio_workers(), e[0],
                                          what, wait)
        except BaseException:
            self._task_done(e)
            raise
        if rc == N.EBUSY:
            self._task_done(e)
            return False
        if rc != 0:
            self._task_done(e)
            raise _error_of(rc, msg)
        e[1] += 1
        e[2] = tok
        return True

    async def acquire_async(self, timeout: Optional[float] = None, *,
                            blocking: bool = True) -> bool:
        """acquire() for asyncio: the calling task is the owner (its own
        hold, reentrant), and the wait does not block the event loop. A
        cancelled task leaves no hold and no place in the store's queue."""
        return await self._acquire_async("acquire", timeout, blocking)

    async def acquire_shared_async(self, timeout: Optional[float] = None, *,
                                   blocking: bool = True) -> bool:
        """acquire_shared() for asyncio, as acquire_async()."""
        return await self._acquire_async("shared", timeout, blocking)

    async def release_async(self) -> None:
        """release() for asyncio: one level of the calling task's hold.
        Raises LockLost when the hold had been lost (roll back)."""
        import asyncio
        task = asyncio.current_task()
        e = self._tasks.by_task.get(task) if task is not None else None
        if e is None or e[1] == 0:
            raise _error_of(N.ENOTHELD, "lock %r is not held by this task"
                            % (self.name,))
        rc, msg, _ = await _aio.run(self._client._aio_workers(), e[0],
                                    "release")
        e[1] -= 1
        tok = e[2]
        if e[1] == 0:
            e[2] = 0
            self._task_done(e)
        if rc == N.ELOST:
            err = _error_of(rc, msg)
            assert isinstance(err, LockLost)
            err.token = tok
            raise err
        if rc != 0:
            raise _error_of(rc, msg)

    async def __aenter__(self) -> "Lock":
        if not await self.acquire_async(None if self._timeout < 0
                                        else self._timeout / 1000.0):
            raise _error_of(N.EBUSY, "lock %r was held by another owner "
                            "for the whole wait" % (self.name,))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release_async()

    def close(self) -> None:
        """Frees the handle; any hold still made through it is released
        first (best effort)."""
        if self._l == ffi.NULL:
            return
        l, self._l = self._l, ffi.NULL
        if self._client._pid != os.getpid():
            return
        for e in self._tasks.by_task.values():
            lib.dlock_close(e[0])
        self._tasks.by_task.clear()
        if getattr(_in_callback, "on", False):
            self._client._deferred.append((l, self._cb))
        else:
            lib.dlock_close(l)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Lock":
        if not self.acquire(None if self._timeout < 0
                            else self._timeout / 1000.0):
            raise error(N.EBUSY)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return "<dlock.Lock %r>" % (self.name,)


class _ReadView:
    """The read side of an RWLock: shared holds, ``with rw.read:``."""

    def __init__(self, lock: Lock) -> None:
        self._lock = lock

    def acquire(self, timeout: Optional[float] = None, *,
                blocking: bool = True) -> bool:
        return self._lock.acquire_shared(timeout, blocking=blocking)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> "_ReadView":
        t = self._lock._timeout
        if not self.acquire(None if t < 0 else t / 1000.0):
            raise error(N.EBUSY)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    async def acquire_async(self, timeout: Optional[float] = None, *,
                            blocking: bool = True) -> bool:
        return await self._lock.acquire_shared_async(timeout,
                                                     blocking=blocking)

    async def release_async(self) -> None:
        await self._lock.release_async()

    async def __aenter__(self) -> "_ReadView":
        t = self._lock._timeout
        if not await self.acquire_async(None if t < 0 else t / 1000.0):
            raise _error_of(N.EBUSY, "lock %r was held by a writer for "
                            "the whole wait" % (self._lock.name,))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release_async()


class RWLock:
    """A read-write lock: any number of readers (``rw.read``) or one writer
    (``rw.write``); a waiting writer goes before later readers."""

    def __init__(self, lock: Lock) -> None:
        self.write = lock
        self.read = _ReadView(lock)

    def close(self) -> None:
        self.write.close()

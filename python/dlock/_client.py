# SPDX-License-Identifier: MIT
"""Client and Lock: the C API, the Python way (python.md in the package)."""
import ctypes
import functools
import inspect as _inspect
import math
import os
import sys
import threading
import time
import types
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List, Optional, Tuple, Union

from . import _aio
from . import _native as N
from ._sigint import Interrupter
from ._errors import (Busy, Closed, DlockError, ForkedClient, InvalidArgument,
                      LockLost, check, error)
from ._elect import Election, Leader, Observer
from ._guard import DEFAULT, Guard
from ._native import lib, text

Name = Union[str, bytes]
LostCallback = Callable[["Lock", int], Any]

# set while a lost-lock callback runs on a client's background thread: a
# handle dropped there is closed later (dlock_close() must not run there)
_in_callback = threading.local()


# the longest lease and wait, in seconds (DLOCK_TTL_MAX, DLOCK_WAIT_MAX)
TTL_MAX = N.TTL_MAX_MS / 1000.0
WAIT_MAX = N.WAIT_MAX_MS / 1000.0


def _ms(seconds: Optional[float], what: str, forever: bool,
        most_ms: int = N.WAIT_MAX_MS) -> int:
    """Seconds (None: forever, when allowed) to the C library's ms, at
    most most_ms (checked before anything is converted: no overflow)."""
    if seconds is None:
        if forever:
            return -1
        raise InvalidArgument("%s must be a number of seconds" % what, N.EINVAL)
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise InvalidArgument("%s must be a number of seconds, not %r"
                              % (what, seconds), N.EINVAL)
    if forever and seconds == -1:
        return -1
    if (isinstance(seconds, float) and math.isnan(seconds)) or seconds < 0:
        raise InvalidArgument("%s must be >= 0 seconds%s, not %r"
                              % (what, " (or None: forever)" if forever else "",
                                 seconds), N.EINVAL)
    # no product that could overflow: exact for ints of any size, and
    # inf is beyond the limit
    if seconds > most_ms // 1000 + 1:
        ms = most_ms + 1
    else:
        ms = int(math.ceil(seconds * 1000))
    if ms > most_ms:
        raise InvalidArgument("%s of %r seconds is beyond the limit of %d "
                              "seconds (%d days)%s"
                              % (what, seconds, most_ms // 1000,
                                 most_ms // 86400000,
                                 "; None waits forever" if forever else ""),
                              N.EINVAL)
    return ms


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
            holder=text(ci.holder),
            token=int(ci.token),
            ttl=None if ci.ttl_ms < 0 else ci.ttl_ms / 1000.0,
            held_for=None if ci.held_ms < 0 else ci.held_ms / 1000.0,
            waiters=None if ci.waiters < 0 else int(ci.waiters),
            queue=[text(ci.queue[i]) for i in range(ci.queue_len)],
            holders=int(ci.holders),
            shared=bool(ci.shared),
            permits=int(ci.permits),
        )


class Client:
    """Connections to one store and one background thread (renewals,
    wake-ups; started by the first acquire), shared by every lock made
    through it and by threads.

    ``uri``: a store URI (docs/stores.md); None or "" means $DLOCK_STORE,
    else the local file store. ``timeout``: the longest one store round
    trip may take, in seconds (default 2). Use as a context manager, or
    call close(). A client must not be used in a child process after
    fork(): ForkedClient; open a new one there.
    """

    def __init__(self, uri: Optional[str] = None,
                 timeout: Optional[float] = None) -> None:
        self._c: Optional[int] = None
        self._pid = os.getpid()
        self._guard = Guard("the client")
        self._workers: Optional[_aio.Workers] = None
        self._intr: Optional[Interrupter] = None
        # the open locks made through it (closed by close()), and locks
        # closed inside a lost-lock callback, to be freed on another thread
        self._locks: "weakref.WeakSet[Lock]" = weakref.WeakSet()
        self._deferred: List["Lock"] = []
        opts = N.ClientOptions()
        if timeout is not None:
            opts.timeout_ms = _ms(timeout, "timeout", False)
            if opts.timeout_ms == 0:
                raise InvalidArgument("timeout must be > 0 seconds", N.EINVAL)
        out = ctypes.c_void_p()
        rc = lib.dlock_client_open(ctypes.byref(out),
                                   (uri or "").encode("utf-8"),
                                   ctypes.byref(opts))
        check(rc)
        self._c = out.value

    # -- life --
    def _forked(self) -> None:
        if self._pid != os.getpid():
            raise ForkedClient(
                "this client was opened in process %d, before a fork(): a "
                "child must open its own client" % self._pid, N.EINVAL)

    def _enter(self) -> Any:
        """Lets one call on the client in (leave with _guard.leave()), or
        raises ForkedClient or Closed. Frees the locks closed in lost-lock
        callbacks meanwhile."""
        self._forked()
        self._free_deferred()
        self._guard.enter()
        return self._c

    def _free_deferred(self) -> None:
        if getattr(_in_callback, "on", False):
            return
        while self._deferred:
            try:
                lk = self._deferred.pop()
            except IndexError:
                return
            lk._finish_close()

    def close(self) -> None:
        """Closes every lock still open through this client (as
        Lock.close(): their waits end with Closed, their holds are
        released, best effort), waits for the client's calls in progress
        to end, stops the background thread and closes the connections.
        Any later call on the client or its locks raises Closed; a second
        close() returns once the first is done. Never from a lost-lock
        callback (InvalidArgument). In a forked child it touches nothing
        of the parent's."""
        g = self._guard
        if self._pid != os.getpid():
            g.mark_closed()
            return
        if getattr(_in_callback, "on", False) and not g.closing:
            raise InvalidArgument("Client.close() in a lost-lock callback: "
                                  "the callback runs on the client's own "
                                  "thread; close it elsewhere", N.EINVAL)
        g.begin(lambda: None)
        # the client's own calls (open, inspect, list, break) end within
        # a store round trip each; nothing to cancel
        g.finish(self._free)

    def _free(self) -> None:
        # no client call is in flight now, and none can start
        while True:
            with self._guard.cv:
                locks = list(self._locks)
                self._locks.clear()
            if not locks:
                break
            for lk in locks:
                lk.close()
        while self._deferred:
            self._deferred.pop()._finish_close()
        if self._intr is not None:
            self._intr.close()
        c, self._c = self._c, None
        if c is not None:
            lib.dlock_client_close(c)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- asyncio: the calls that talk to the store, off the event loop --
    @classmethod
    async def open_async(cls, uri: Optional[str] = None,
                         timeout: Optional[float] = None) -> "Client":
        """``Client(uri, timeout)`` for asyncio: connects on a worker
        thread, the event loop runs meanwhile."""
        import asyncio
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: cls(uri, timeout))

    async def close_async(self) -> None:
        """close() for asyncio, off the event loop."""
        import asyncio
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close_async()

    async def inspect_async(self, name: Name) -> "Info":
        """inspect() for asyncio, off the event loop."""
        import asyncio
        return await asyncio.get_running_loop().run_in_executor(
            None, self.inspect, name)

    async def leader_async(self, name: Name) -> "Leader":
        """leader() for asyncio, off the event loop."""
        import asyncio
        return await asyncio.get_running_loop().run_in_executor(
            None, self.leader, name)

    def _wait(self, handles: "List[int]", call: Callable[[int], int],
              wait: int, closing: Callable[[], bool]) -> int:
        """call(ms): a blocking acquire through ``handles``, ``wait`` ms
        at most (-1: forever). On the main thread a signal ends the wait
        (_sigint.py): its handler's exception (KeyboardInterrupt) goes
        on from here; a handler that returns lets the wait go on for the
        time left. A wait another thread's signal ended (the handle is
        shared by the lock's threads) goes on too."""
        deadline = None if wait <= 0 else time.monotonic() + wait / 1000.0
        ms = wait
        for _ in range(10000):  # each round needs a signal
            old = None
            if ms != 0 and threading.current_thread() is \
                    threading.main_thread():
                if self._intr is None:
                    self._intr = Interrupter()
                def cancel() -> None:
                    for h in handles:
                        lib.dlock_cancel(h)
                old = self._intr.arm(cancel)
            try:
                rc = int(call(ms))
            finally:
                if old is not None and self._intr is not None:
                    self._intr.disarm(old)
            if rc != N.ECANCELED or closing():
                return rc
            if deadline is not None:
                ms = max(0, int(math.ceil((deadline - time.monotonic())
                                          * 1000)))
        return rc

    def locked(self, name: Name, ttl: Optional[float] = None,
               **options: Any) -> Callable[[Any], Any]:
        """A decorator: the function runs holding lock ``name`` (each call
        waits for it, ``timeout`` as ``with lock:``: Busy when it runs
        out). Works on plain and ``async`` functions; ``options`` are
        lock()'s. The lock is ``fn.lock``::

            @client.locked("nightly-report", ttl=60, timeout=0)
            def report(): ...
        """
        lk = self.lock(name, ttl, **options)

        def decorate(fn: Any) -> Any:
            if _inspect.iscoroutinefunction(fn):
                @functools.wraps(fn)
                async def run_async(*args: Any, **kw: Any) -> Any:
                    async with lk:
                        return await fn(*args, **kw)
                run_async.lock = lk  # type: ignore[attr-defined]
                return run_async

            @functools.wraps(fn)
            def run(*args: Any, **kw: Any) -> Any:
                with lk:
                    return fn(*args, **kw)
            run.lock = lk  # type: ignore[attr-defined]
            return run
        return decorate

    def __del__(self) -> None:
        # no Lock refers to it (each keeps its client alive), and no call
        # is in flight (its frame would refer to it)
        try:
            if getattr(self, "_guard", None) is not None:
                self.close()
        except Exception:
            pass

    @property
    def store(self) -> str:
        """The store URI, with any password replaced by ***."""
        c = self._enter()
        try:
            return text(lib.dlock_client_store(c))
        finally:
            self._guard.leave()

    def __repr__(self) -> str:
        try:
            return "<dlock.Client %s>" % self.store
        except DlockError:
            return "<dlock.Client closed>"

    def _aio_workers(self) -> "_aio.Workers":
        if self._workers is None:
            self._workers = _aio.Workers()
        return self._workers

    # -- locks --
    def lock(self, name: Name, ttl: Optional[float] = None, *,
             fair: bool = False, renew: bool = True, reentrant: bool = True,
             timeout: Optional[float] = None,
             on_lost: Optional[LostCallback] = None,
             owner: str = "thread", at_least: Optional[float] = None,
             at_most: Optional[float] = None) -> "Lock":
        """A lock called ``name`` (str, as UTF-8, or bytes). ``ttl``: the
        lease in seconds (default 30), renewed every ttl/3 while held
        unless ``renew=False``. ``fair``: first come, first served.
        ``timeout``: how long ``with lock:`` waits (None: as long as it
        takes). ``on_lost(lock, token)`` runs on the client's background
        thread when a hold is found lost; it must return quickly.
        ``owner``: "thread" (each thread its own hold, as in C) or "lock"
        (the Lock object is the owner: any thread may release it).
        ``at_least``: seconds the lock stays taken after it was taken,
        even when released sooner or the process dies (a job cron fires
        on many hosts runs once); ``at_most``: seconds a hold may last at
        most (then it is reported lost). Stores with leases only
        (NotSupported elsewhere; docs/locks.md "Scheduled jobs")."""
        return Lock(self, name, ttl, fair=fair, renew=renew,
                    reentrant=reentrant, timeout=timeout, on_lost=on_lost,
                    owner=owner, at_least=at_least, at_most=at_most)

    def locks(self, names: "List[Name]", ttl: Optional[float] = None, *,
              renew: bool = True, timeout: Optional[float] = None,
              on_lost: Optional[LostCallback] = None) -> "LockSet":
        """Several locks at once, all or none (``dlock_acquire_all()``):
        ``with client.locks(["account:1", "account:2"]) as held:``. They
        are taken in byte order of their names, whatever the order given,
        so that sets with names in common cannot deadlock; a wait that
        cannot have them all gives back what it took. ``timeout`` as for
        ``lock()``; ``on_lost`` is every lock's (losing any one loses the
        set: the ``with`` block's end raises LockLost)."""
        return LockSet(self, names, ttl, renew=renew, timeout=timeout,
                       on_lost=on_lost)

    def election(self, name: Name, ttl: Optional[float] = None, *,
                 value: Optional[str] = None,
                 timeout: Optional[float] = None,
                 on_lost: Optional[LostCallback] = None) -> "Election":
        """Leadership of election ``name`` (python.md, "Leader
        election"): ``with client.election("svc", value="10.0.0.1:80"):``
        leads while the block runs. The leader is the holder of lock
        ``name``; ``value`` (up to 127 printable bytes; default: this
        host, pid and thread) is what observers read; its term is the
        hold's fencing token. ``ttl``, ``timeout``, ``on_lost`` as for
        ``lock()``."""
        return Election(Lock(self, name, ttl, timeout=timeout,
                             on_lost=on_lost), value)

    def leader(self, name: Name) -> "Leader":
        """The leader of election ``name`` now (one read)."""
        cl = N.LeaderC()
        n = _name(name)
        c = self._enter()
        try:
            check(lib.dlock_leader_get(c, n, ctypes.byref(cl)))
        finally:
            self._guard.leave()
        return Leader._from(cl)

    def observe(self, name: Name) -> "Observer":
        """An Observer of election ``name``: its leader now, then every
        change, as the store tells of it. NotSupported on stores that
        cannot be observed yet (docs/locks.md)."""
        return Observer(self, name)

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
        ci = N.Info()
        n = _name(name)
        c = self._enter()
        try:
            check(lib.dlock_inspect(c, n, ctypes.byref(ci)))
        finally:
            self._guard.leave()
        try:
            return Info._from(ci)
        finally:
            lib.dlock_info_clear(ctypes.byref(ci))

    def list(self, prefix: Name = "", *, free: bool = False,
             page: int = 100) -> Iterator[Tuple[Union[str, bytes], Info]]:
        """The locks held or waited for (``free=True``: every lock the
        store keeps) whose names start with ``prefix``, as (name, Info),
        a page of ``page`` at a time. A name that is not UTF-8 is bytes."""
        cursor: Optional[bytes] = None
        keep = None
        while True:
            p = N.ListPage()
            c = self._enter()
            try:
                check(lib.dlock_list(c, _name(prefix), cursor, page,
                                     N.LIST_FREE if free else 0,
                                     ctypes.byref(p)))
            finally:
                self._guard.leave()
            try:
                got = [(_text(p.locks[i].name or b""),
                        Info._from(p.locks[i].info)) for i in range(p.n)]
                keep = ctypes.string_at(p.next) if p.next else None
            finally:
                lib.dlock_list_clear(ctypes.byref(p))
            yield from got
            if keep is None:
                return
            cursor = keep

    def check(self, ttl: Optional[float] = None) -> "CheckReport":
        """What makes locks unsafe or slow on this store's deployment, for
        holds of ``ttl`` seconds (default 10), as ``dlock doctor`` says
        it (a few round trips; takes no lock)."""
        ms = 0 if ttl is None else _ms(ttl, "ttl", False, N.TTL_MAX_MS)
        cr = N.Check()
        c = self._enter()
        try:
            check(lib.dlock_client_check(c, ms, ctypes.byref(cr)))
        finally:
            self._guard.leave()
        try:
            s = text
            off = cr.clock_offset_ms
            return CheckReport(
                [Finding(s(cr.findings[i].check), s(cr.findings[i].what),
                         s(cr.findings[i].fix)) for i in range(cr.n)],
                cr.round_trip_us / 1e6,
                None if off == -(2 ** 63) else off / 1000.0,
                s(cr.notes))
        finally:
            lib.dlock_check_clear(ctypes.byref(cr))

    def break_lock(self, name: Name) -> Info:
        """Breaks a stuck lock (an operator's command): removes every hold
        of it and wakes its waiters; the evicted holders learn at their
        next renewal. Returns what was evicted."""
        ci = N.Info()
        n = _name(name)
        c = self._enter()
        try:
            check(lib.dlock_break(c, n, ctypes.byref(ci)))
        finally:
            self._guard.leave()
        try:
            return Info._from(ci)
        finally:
            lib.dlock_info_clear(ctypes.byref(ci))


@dataclass(frozen=True)
class Finding:
    """One thing ``Client.check()`` found (docs/locks.md, "Checking a
    deployment")."""

    check: str  # a stable name: "redis-persistence", ...
    what: str  # what was found, and why it matters
    fix: str  # what to change


@dataclass(frozen=True)
class CheckReport:
    """What ``Client.check()`` measured and found."""

    findings: List[Finding]
    round_trip: float  # seconds, the median of a few round trips
    clock_offset: Optional[float]  # seconds, the store's clock less ours
    not_checked: str  # what could not be checked, and why


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
                 permits: int = 0, owner: str = "thread",
                 at_least: Optional[float] = None,
                 at_most: Optional[float] = None) -> None:
        self._l: Optional[int] = None
        self._client = client  # kept alive as long as the lock
        self._guard = Guard("lock %r" % (name,))
        self._tasks = _aio.TaskHolds()
        if owner not in ("thread", "lock"):
            raise InvalidArgument('owner must be "thread" or "lock", not %r'
                                  % (owner,), N.EINVAL)
        self._timeout = _ms(timeout, "timeout", True)
        self._on_lost = on_lost
        self._permits = permits
        # holds made through the lock and not released (every owner's):
        # a lock collected with some is released with a ResourceWarning
        self._holds = 0
        # a semaphore's further permits of one owner: a handle each
        # (DLOCK_OWNER_HANDLE), kept open for reuse until close()
        self._spare: List[int] = []
        self._extra_all: List[int] = []
        opts = N.Options()
        if ttl is not None:
            opts.ttl_ms = _ms(ttl, "ttl", False, N.TTL_MAX_MS)
            if opts.ttl_ms == 0:
                raise InvalidArgument("ttl must be > 0 seconds", N.EINVAL)
        opts.flags = ((0 if renew else N.NO_RENEW) | (N.FAIR if fair else 0)
                      | (0 if reentrant else N.NOT_REENTRANT)
                      | (N.OWNER_HANDLE if owner == "lock" else 0))
        opts.permits = permits
        if at_least is not None:
            opts.at_least_ms = _ms(at_least, "at_least", False, N.TTL_MAX_MS)
        if at_most is not None:
            opts.at_most_ms = _ms(at_most, "at_most", False, N.TTL_MAX_MS)
        # the owner's token, for LockLost: per thread, or the lock's own
        self._tls: Any = (threading.local() if owner == "thread"
                          else types.SimpleNamespace(token=0))
        self._cb = None
        if on_lost is not None:
            if not callable(on_lost):
                raise InvalidArgument("on_lost must be callable", N.EINVAL)
            self._cb = N.LOST_CB(self._lost)
            opts.on_lost = self._cb
        self._name = _name(name)
        self._opts = opts  # for the handles of asyncio tasks
        out = ctypes.c_void_p()
        c = client._enter()
        try:
            check(lib.dlock_open(ctypes.byref(out), c, self._name,
                                 ctypes.byref(opts)))
            self._l = out.value
            with client._guard.cv:
                client._locks.add(self)
        finally:
            client._guard.leave()

    def _lost(self, _l: Any, token: int, _arg: Any) -> None:
        # on the client's background thread: an exception of the callback
        # goes to sys.unraisablehook (printed with its traceback by
        # default), as for an exception in a __del__
        _in_callback.on = True
        try:
            if self._on_lost is not None:
                self._on_lost(self, int(token))
        except BaseException as e:
            sys.unraisablehook(types.SimpleNamespace(  # type: ignore
                exc_type=type(e), exc_value=e, exc_traceback=e.__traceback__,
                err_msg="Exception in the on_lost callback of lock %r"
                        % (self.name,),
                object=self._on_lost))
        finally:
            _in_callback.on = False

    def _enter(self) -> Guard:
        """Lets one call on the lock's handles in, or raises ForkedClient
        or Closed (the lock's, or its client's). Leave with .leave()."""
        self._client._forked()
        self._client._free_deferred()
        if self._client._guard.closing:
            raise self._client._guard.closed_error()
        self._guard.enter()
        return self._guard

    def _closed_while(self) -> Closed:
        if self._guard.closing:
            return self._guard.closed_error(waited=True)
        return self._client._guard.closed_error(waited=True)

    @property
    def name(self) -> Union[str, bytes]:
        return _text(self._name)

    def _wait_ms(self, timeout: Any, blocking: bool) -> int:
        """The one timeout rule: blocking=False tries once; no timeout
        given, the lock's (client.lock(timeout=...), default forever);
        None, forever; else at most that many seconds."""
        if not blocking:
            return 0
        if timeout is DEFAULT:
            return self._timeout
        return _ms(timeout, "timeout", True)

    def _closing(self) -> bool:
        return self._guard.closing or self._client._guard.closing

    def _spare_handle(self, g: Guard) -> int:
        """A handle of its own for a further permit (under the guard)."""
        with g.cv:
            if self._spare:
                return self._spare.pop()
        opts = N.Options.from_buffer_copy(self._opts)
        opts.flags |= N.OWNER_HANDLE
        out = ctypes.c_void_p()
        check(lib.dlock_open(ctypes.byref(out), self._client._c,
                             self._name, ctypes.byref(opts)))
        h = int(out.value or 0)
        with g.cv:
            self._extra_all.append(h)
        return h

    def _extra(self) -> "List[int]":
        """The calling owner's further permits, newest last."""
        ex = getattr(self._tls, "extra", None)
        if ex is None:
            ex = self._tls.extra = []
        return ex

    def _acquire(self, fn: Any, timeout: Any, blocking: bool,
                 shared: bool = False) -> bool:
        wait = self._wait_ms(timeout, blocking)
        g = self._enter()
        try:
            h = int(self._l or 0)
            more = bool(self._permits) and lib.dlock_held(self._l) > 0
            if more:
                # a semaphore whose permit this owner holds: another
                # permit, through a handle of its own
                h = self._spare_handle(g)
            n0 = max(0, lib.dlock_held(h))
            ok = False
            try:
                rc = self._client._wait([h], lambda ms: int(fn(h, ms)), wait,
                                        self._closing)
                if g.closing:
                    # close() cancelled the wait (or a lock got just
                    # before the cancel, which the close releases)
                    raise self._closed_while()
                if rc == N.EBUSY:
                    return False
                check(rc)
                if more:
                    self._extra().append(h)
                elif n0 == 0:
                    self._tls.shared = shared
                self._tls.token = int(lib.dlock_token(h))
                with g.cv:
                    self._holds += 1
                ok = True
                return True
            except BaseException:
                # a signal's exception (KeyboardInterrupt) lands as the
                # call returns, maybe just after the store granted the
                # lock: give that back
                if not ok and not g.closing and lib.dlock_held(h) > n0:
                    lib.dlock_release(h)
                raise
            finally:
                if more and not ok:
                    with g.cv:
                        self._spare.append(h)
        finally:
            g.leave()

    def acquire(self, timeout: Any = DEFAULT, *,
                blocking: bool = True) -> bool:
        """Acquires the lock for the calling thread: True when it holds it,
        False when another owner held it for the whole wait (``with
        lock:`` raises Busy, a TimeoutError, instead). ``timeout``: not
        given, the lock's (``client.lock(timeout=...)``, default: as
        long as it takes); None waits as long as it takes, 0 tries once,
        else at most that many seconds (``blocking=False`` is
        ``timeout=0``). Waiting is woken by the store and releases the
        GIL; on the main thread, Ctrl-C ends it at once
        (KeyboardInterrupt, leaving nothing in the store's queue). On a
        semaphore, an owner that holds a permit takes another. Raises
        LockLost when the thread's earlier hold was lost and not yet
        released, Closed when the lock or its client is closed (also
        while the call waits), and the store's errors
        (ConnectionFailed, ...)."""
        return self._acquire(lib.dlock_acquire, timeout, blocking)

    def acquire_shared(self, timeout: Any = DEFAULT, *,
                       blocking: bool = True) -> bool:
        """A shared (read) hold for the calling thread, as acquire()."""
        return self._acquire(lib.dlock_acquire_shared, timeout, blocking,
                             shared=True)

    def release(self) -> None:
        """Releases one level of the calling thread's hold. Raises LockLost
        when the hold had been lost: the critical section was not
        protected (roll back). NotHeld when the thread holds no such
        lock."""
        self._release(lib.dlock_release)

    def _timeout_s(self) -> Optional[float]:
        """``timeout`` as given (None: forever)."""
        return None if self._timeout < 0 else self._timeout / 1000.0

    def _release(self, fn: Any) -> None:
        g = self._enter()
        try:
            extra = getattr(self._tls, "extra", None)
            h = extra[-1] if extra else self._l
            tok = int(lib.dlock_token(h)) if extra else \
                getattr(self._tls, "token", 0)
            rc = fn(h)
            if rc in (N.EOK, N.ELOST):
                with g.cv:
                    self._holds -= 1
                    if extra:
                        extra.pop()
                        self._spare.append(h)
                self._tls.token = (int(lib.dlock_token(extra[-1])) if extra
                                   else int(lib.dlock_token(self._l)))
            if rc == N.ELOST:
                e = error(rc)
                assert isinstance(e, LockLost)
                e.token = tok
                raise e
            check(rc)
        finally:
            g.leave()

    def _owner(self) -> Tuple[int, int, bool]:
        """The handle of the caller's hold, its further permits, and
        whether it is a shared hold: its asyncio task's, inside a task
        that holds through this lock, else the thread's (the newest
        permit's on a semaphore). Under the guard."""
        t = self._tasks.current()
        if t is not None:
            return t[0], 0, bool(t[3])
        extra = getattr(self._tls, "extra", None)
        return (extra[-1] if extra else self._l, len(extra or ()),
                bool(getattr(self._tls, "shared", False)))

    def extend(self, ttl: float) -> None:
        """Sets the caller's lease to ``ttl`` seconds from now (and makes
        it the lease the watchdog renews to): the calling thread's hold,
        or inside an asyncio task that holds the lock, the task's. One
        store round trip: extend_async() in a task."""
        ms = _ms(ttl, "ttl", False, N.TTL_MAX_MS)
        g = self._enter()
        try:
            check(lib.dlock_extend(self._owner()[0], ms))
        finally:
            g.leave()

    async def extend_async(self, ttl: float) -> None:
        """extend() for asyncio: the calling task's hold, off the event
        loop."""
        import asyncio
        ms = _ms(ttl, "ttl", False, N.TTL_MAX_MS)
        e = self._tasks.current()
        if e is None or e[1] == 0:
            raise _error_of(N.ENOTHELD, "lock %r is not held by this task"
                            % (self.name,))
        h = e[0]
        g = self._enter()
        try:
            rc, msg = await asyncio.get_running_loop().run_in_executor(
                None, lambda: (int(lib.dlock_extend(h, ms)), N.errmsg()))
        finally:
            g.leave()
        if rc != 0:
            raise _error_of(rc, msg)

    def _local(self, fn: Any) -> int:
        """fn on the handle of the caller's hold (_owner())."""
        g = self._enter()
        try:
            return int(fn(self._owner()[0]))
        finally:
            g.leave()

    def _state(self) -> Tuple[int, int, int, bool]:
        """The caller's dlock_held(), token, further permits and
        whether its hold is shared, read together."""
        g = self._enter()
        try:
            h, more, shared = self._owner()
            held = int(lib.dlock_held(self._l if more else h))
            return held, int(lib.dlock_token(h)), more, shared
        finally:
            g.leave()

    @property
    def token(self) -> int:
        """The fencing token of the caller's hold (0: none): the calling
        thread's, or inside an asyncio task that holds it, the task's (on
        a semaphore, its newest permit's)."""
        return self._local(lib.dlock_token)

    @property
    def held(self) -> bool:
        """Whether the caller (thread, or asyncio task) holds the lock
        (any hold: exclusive, shared or a permit) and has not lost it."""
        return self._local(lib.dlock_held) > 0

    @property
    def lost(self) -> bool:
        """Whether the caller's hold was lost and awaits release()."""
        return self._local(lib.dlock_held) == N.ELOST

    @property
    def hold_count(self) -> int:
        """The caller's reentrant hold count (0: not held); on a
        semaphore, the permits it holds."""
        held, _, more, _ = self._state()
        return max(0, held) + more

    # -- asyncio: each task an owner (_aio.py) --
    def _task_entry(self) -> List[Any]:
        import asyncio
        task = asyncio.current_task()
        if task is None:
            raise InvalidArgument("the async methods run inside an asyncio "
                                  "task", N.EINVAL)
        g = self._enter()
        try:
            e = self._tasks.by_task.get(task)
            if e is None:
                opts = N.Options.from_buffer_copy(self._opts)
                opts.flags |= N.OWNER_HANDLE
                out = ctypes.c_void_p()
                check(lib.dlock_open(ctypes.byref(out), self._client._c,
                                     self._name, ctypes.byref(opts)))
                # handle, hold count, token, a shared hold
                e = [out.value, 0, 0, False]
                with g.cv:
                    self._tasks.by_task[task] = e
            return e
        finally:
            g.leave()

    def _task_done(self, e: List[Any]) -> None:
        """Frees a task's handle that holds nothing any more; once the
        lock is closing, close() frees it."""
        if e[1] != 0:
            return
        try:
            g = self._enter()
        except DlockError:
            return
        try:
            with g.cv:
                mine = False
                for t, v in list(self._tasks.by_task.items()):
                    if v is e:
                        del self._tasks.by_task[t]
                        mine = True
            if mine:
                lib.dlock_close(e[0])
        finally:
            g.leave()

    async def _acquire_async(self, what: str, timeout: Any,
                             blocking: bool) -> bool:
        import asyncio
        wait = self._wait_ms(timeout, blocking)
        e = self._task_entry()
        if self._permits and e[1] > 0:
            raise InvalidArgument(
                "this task holds a permit of semaphore %r already: a task "
                "takes one permit at a time (a second task takes another)"
                % (self.name,), N.EINVAL)
        try:
            rc, msg, tok = await _aio.run(self._guard,
                                          self._client._aio_workers(), e[0],
                                          what, wait)
        except (Exception, asyncio.CancelledError):
            # the call is over (run() saw it end): nothing runs on e
            self._task_done(e)
            raise
        # (any other BaseException, such as GeneratorExit when a pending
        # task is destroyed: the call may still run on e, which stays for
        # close() to free)
        if self._guard.closing or self._client._guard.closing:
            raise self._closed_while()
        if rc == N.EBUSY:
            self._task_done(e)
            return False
        if rc != 0:
            self._task_done(e)
            raise _error_of(rc, msg)
        if e[1] == 0:
            e[3] = what == "shared"
        e[1] += 1
        e[2] = tok
        with self._guard.cv:
            self._holds += 1
        return True

    async def acquire_async(self, timeout: Any = DEFAULT, *,
                            blocking: bool = True) -> bool:
        """acquire() for asyncio: the calling task is the owner (its own
        hold, reentrant), and the wait does not block the event loop. A
        cancelled task leaves no hold and no place in the store's queue.
        Closed when the lock or its client is closed, also while the task
        waits."""
        return await self._acquire_async("acquire", timeout, blocking)

    async def acquire_shared_async(self, timeout: Any = DEFAULT, *,
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
            if self._guard.closing or self._client._guard.closing:
                raise self._closed_while()
            raise _error_of(N.ENOTHELD, "lock %r is not held by this task"
                            % (self.name,))
        rc, msg, _ = await _aio.run(self._guard, self._client._aio_workers(),
                                    e[0], "release")
        if rc in (N.EOK, N.ELOST):
            with self._guard.cv:
                self._holds -= 1
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

    def _busy(self, who: str = "another owner") -> Exception:
        t = self._timeout_s()
        return _error_of(N.EBUSY, "lock %r was held by %s for the whole "
                         "wait (%s)" % (self.name, who,
                                        "no timeout" if t is None
                                        else "timeout %g s" % t))

    async def __aenter__(self) -> "Lock":
        if not await self.acquire_async():
            raise self._busy()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release_async()

    def _shut_all(self) -> None:
        # under the guard's mutex, with the handles still allocated: ends
        # their waits, and refuses an acquire let in before close() began
        # that reaches the library only now (a task's handle opened after
        # this is never acquired through: its call is refused Closed)
        if self._l is not None:
            lib.dlock_shutdown(self._l)
        for e in self._tasks.by_task.values():
            lib.dlock_shutdown(e[0])
        for h in self._extra_all:
            lib.dlock_shutdown(h)

    def _free(self) -> None:
        # nothing is in flight on the handles now, and nothing can start
        tasks = list(self._tasks.by_task.values())
        self._tasks.by_task.clear()
        for e in tasks:
            lib.dlock_close(e[0])
        extra, self._extra_all = self._extra_all, []
        self._spare = []
        for h in extra:
            lib.dlock_close(h)
        l, self._l = self._l, None
        if l is not None:
            lib.dlock_close(l)

    def _finish_close(self) -> None:
        self._guard.finish(self._free)

    def close(self) -> None:
        """Frees the handle. Calls waiting in acquire() (threads, and
        asyncio tasks) end at once with Closed; calls in progress are
        waited for (a store round trip at most); then any hold still made
        through the lock is released (best effort). Later calls raise
        Closed; a second close() returns once the first is done. Inside
        the lock's own lost-lock callback the handle is freed later, on
        another thread."""
        g = getattr(self, "_guard", None)
        if g is None:
            return  # __init__ failed early
        if self._client._pid != os.getpid():
            g.mark_closed()  # a forked child: nothing here is ours
            return
        began = g.begin(self._shut_all)
        if getattr(_in_callback, "on", False):
            # never wait or free on the client's own thread: the client's
            # next call (on another thread), or its close(), frees it
            if began:
                self._client._deferred.append(self)
            return
        g.finish(self._free)

    async def close_async(self) -> None:
        """close() for asyncio, off the event loop (releasing what is
        still held takes a store round trip)."""
        import asyncio
        await asyncio.get_running_loop().run_in_executor(None, self.close)

    def __del__(self) -> None:
        # no call is in flight on it: a thread's frame refers to it, and
        # a worker thread's call to its task (through the future it will
        # complete), whose coroutine refers to it. close() would cancel
        # and wait for one all the same. A lock dropped while held is
        # released, never silently: a ResourceWarning says so, as for a
        # file left open (python.md, "A lock dropped while held")
        try:
            g = getattr(self, "_guard", None)
            if g is not None and not g.closing and self._holds > 0 and \
                    self._client._pid == os.getpid():
                warnings.warn(
                    "lock %r was garbage-collected while held: its hold "
                    "is released now (release it, or keep a reference to "
                    "the lock while it is held)" % (self.name,),
                    ResourceWarning, source=self)
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Lock":
        if not self.acquire():
            raise self._busy()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return "<dlock.Lock %r>" % (self.name,)


class _View:
    """One side of an RWLock: ``rw.read`` (shared holds) or ``rw.write``
    (the exclusive hold), each with acquire/release, ``with``, ``async
    with``, and the caller's ``held``, ``token``, ``lost`` and
    ``hold_count`` for that side only (a read hold is not ``write.held``).
    ``lock`` is the Lock both sides share."""

    def __init__(self, lock: Lock, shared: bool) -> None:
        self.lock = lock
        self._shared = shared

    @property
    def name(self) -> Union[str, bytes]:
        return self.lock.name

    def acquire(self, timeout: Any = DEFAULT, *,
                blocking: bool = True) -> bool:
        if self._shared:
            return self.lock.acquire_shared(timeout, blocking=blocking)
        return self.lock.acquire(timeout, blocking=blocking)

    def release(self) -> None:
        """Releases one level of the caller's hold (NotHeld when the
        caller's hold is of the other side)."""
        if self.lock.held and self._mine() is None:
            raise _error_of(N.ENOTHELD, "lock %r is held %s by the caller,"
                            " not %s" % (self.lock.name,
                                         "exclusively" if self._shared
                                         else "shared",
                                         "shared" if self._shared
                                         else "exclusively"))
        self.lock.release()

    def _mine(self) -> Optional[Tuple[int, int]]:
        """(dlock_held(), token) of the caller's hold when it is of this
        side, else None."""
        held, tok, _, shared = self.lock._state()
        if held == 0 or shared != self._shared:
            return None
        return held, tok

    @property
    def held(self) -> bool:
        """Whether the caller holds this side and has not lost it."""
        m = self._mine()
        return m is not None and m[0] > 0

    @property
    def lost(self) -> bool:
        """Whether the caller's hold of this side was lost."""
        m = self._mine()
        return m is not None and m[0] == N.ELOST

    @property
    def token(self) -> int:
        """The fencing token of the caller's hold of this side (0: none)."""
        m = self._mine()
        return m[1] if m is not None else 0

    @property
    def hold_count(self) -> int:
        m = self._mine()
        return max(0, m[0]) if m is not None else 0

    def __enter__(self) -> "_View":
        if not self.acquire():
            raise self.lock._busy("a writer" if self._shared
                                  else "another owner")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    async def acquire_async(self, timeout: Any = DEFAULT, *,
                            blocking: bool = True) -> bool:
        if self._shared:
            return await self.lock.acquire_shared_async(timeout,
                                                        blocking=blocking)
        return await self.lock.acquire_async(timeout, blocking=blocking)

    async def release_async(self) -> None:
        await self.lock.release_async()

    async def __aenter__(self) -> "_View":
        if not await self.acquire_async():
            raise self.lock._busy("a writer" if self._shared
                                  else "another owner")
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.release_async()

    def __repr__(self) -> str:
        return "<dlock.RWLock %r %s>" % (self.lock.name,
                                        "read" if self._shared else "write")


class RWLock:
    """A read-write lock: any number of readers (``rw.read``) or one writer
    (``rw.write``); a waiting writer goes before later readers. Each side
    is a view of one Lock (``rw.lock``)."""

    def __init__(self, lock: Lock) -> None:
        self.lock = lock
        self.write = _View(lock, False)
        self.read = _View(lock, True)

    def close(self) -> None:
        self.lock.close()

    async def close_async(self) -> None:
        await self.lock.close_async()


class LockSet:
    """Several locks of one client, taken and released together
    (``dlock_acquire_all()``, ``dlock_release_all()``; docs/locks.md
    "Several locks at once"). Each is a Lock of its own (``set.locks``,
    in the order given), owned by the calling thread. Made by
    ``Client.locks()``; a context manager."""

    def __init__(self, client: Client, names: "List[Name]",
                 ttl: Optional[float], *, renew: bool = True,
                 timeout: Optional[float] = None,
                 on_lost: Optional[LostCallback] = None) -> None:
        if isinstance(names, (str, bytes)):
            raise InvalidArgument("locks() takes a list of names, not one "
                                  "name", N.EINVAL)
        self._timeout = _ms(timeout, "timeout", True)
        self.locks: List[Lock] = []
        try:
            for n in names:
                self.locks.append(Lock(client, n, ttl, renew=renew,
                                       on_lost=on_lost))
        except BaseException:
            self.close()
            raise

    def _call(self, fn: Any, wait: Optional[int] = None) -> int:
        """fn(array of the handles, n[, wait]) with every lock entered;
        an acquire (wait given) as Lock.acquire() waits: Ctrl-C ends it,
        and what it got is given back."""
        entered: List[Guard] = []
        try:
            for lk in self.locks:
                entered.append(lk._enter())
            hs = [int(lk._l or 0) for lk in self.locks]
            arr = N.handles(hs)
            if wait is None:
                rc = int(fn(arr, len(hs)))
            else:
                n0 = [max(0, lib.dlock_held(h)) for h in hs]
                try:
                    rc = self.locks[0]._client._wait(
                        hs, lambda ms: int(fn(arr, len(hs), ms)), wait,
                        lambda: any(lk._closing() for lk in self.locks))
                except BaseException:
                    if all(lib.dlock_held(h) > n for h, n in zip(hs, n0)) \
                            and not any(g.closing for g in entered):
                        lib.dlock_release_all(arr, len(hs))
                    raise
            for lk, g in zip(self.locks, entered):
                if g.closing:
                    raise lk._closed_while()
            return rc
        finally:
            for g in entered:
                g.leave()

    def acquire(self, timeout: Any = DEFAULT, *,
                blocking: bool = True) -> bool:
        """Acquires every lock for the calling thread: True when it holds
        them all, False when one was held by another owner for the whole
        wait (then none is held). ``timeout`` as for Lock.acquire() (not
        given: the set's, ``client.locks(timeout=...)``)."""
        if not blocking:
            wait = 0
        elif timeout is DEFAULT:
            wait = self._timeout
        else:
            wait = _ms(timeout, "timeout", True)
        if not self.locks:
            return True
        rc = self._call(lib.dlock_acquire_all, wait)
        if rc == N.EBUSY:
            return False
        check(rc)
        for lk in self.locks:
            lk._tls.token = int(lib.dlock_token(lk._l))
            with lk._guard.cv:
                lk._holds += 1
        return True

    def release(self) -> None:
        """Releases every lock of the set, whatever each answers. Raises
        LockLost when any was lost (the set's work was not protected)."""
        rc = self._call(lib.dlock_release_all)
        for lk in self.locks:
            if rc in (N.EOK, N.ELOST):
                with lk._guard.cv:
                    lk._holds -= 1
            if lib.dlock_held(lk._l) == 0:
                lk._tls.token = 0
        check(rc)

    @property
    def tokens(self) -> "List[int]":
        """The fencing tokens of the calling thread's holds, in the
        order of the names given (0: not held)."""
        return [lk.token for lk in self.locks]

    @property
    def held(self) -> bool:
        """Whether the calling thread holds every lock of the set."""
        return all(lk.held for lk in self.locks)

    def close(self) -> None:
        """Closes every lock (Lock.close())."""
        for lk in self.locks:
            lk.close()

    def __enter__(self) -> "LockSet":
        if not self.acquire():
            t = self._timeout
            raise _error_of(N.EBUSY, "locks %r: one was held by another "
                            "owner for the whole wait (%s)"
                            % ([lk.name for lk in self.locks],
                               "timeout %g s" % (t / 1000.0) if t >= 0
                               else "no timeout"))
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return "<dlock.LockSet %r>" % ([lk.name for lk in self.locks],)

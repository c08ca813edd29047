# SPDX-License-Identifier: MIT
"""Leader election (python.md, "Leader election"): an Election is a
Lock whose hold carries the leader's value; Leader is what the store says
of an election; an Observer reports every change, woken by the store."""
import asyncio
import ctypes
import select
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional

from . import _native as N
from ._errors import Closed, InvalidArgument, check
from ._guard import DEFAULT
from ._native import lib, text

if TYPE_CHECKING:
    from ._client import Client, Lock, Name


@dataclass(frozen=True)
class Leader:
    """An election's leader as the store says it (``Client.leader()``, an
    Observer's changes)."""

    present: bool  # a leader leads
    term: int  # its term (a fencing token: terms only grow); 0 unknown
    value: str  # its value ("" with none)
    lease: Optional[float]  # seconds of its lease left; None: no lease
    error: Optional[str] = None  # an Observer that cannot reach the store
    # says why (the rest: the last leader it saw)

    @staticmethod
    def _from(cl: Any) -> "Leader":
        why = text(cl.why)
        return Leader(
            present=bool(cl.present),
            term=int(cl.term),
            value=text(cl.value),
            lease=None if cl.ttl_ms < 0 else cl.ttl_ms / 1000.0,
            error=why if cl.error else None,
        )


def _value(v: Optional[str]) -> Any:
    if v is None:
        return None
    if not isinstance(v, str):
        raise InvalidArgument("value must be a str, not %r" % (v,),
                              N.EINVAL)
    return v.encode()


class Election:
    """Leadership of election ``name`` (``Client.election()``): campaign()
    waits to lead, resign() gives it up, proclaim() changes the value.
    ``with election:`` campaigns and resigns. The term is ``token``."""

    def __init__(self, lock: "Lock", value: Optional[str]) -> None:
        self.lock = lock
        self._value = value

    def campaign(self, value: Optional[str] = None,
                 timeout: Any = DEFAULT, *,
                 blocking: bool = True) -> bool:
        """Waits to lead (``timeout`` as Lock.acquire(); not given, the
        election's, ``client.election(timeout=...)``): True when the
        calling thread leads, with ``value`` (default: the election's) as
        the leader's value; False when another led for the whole wait."""
        v = _value(value if value is not None else self._value)
        return self.lock._acquire(
            lambda l, w: lib.dlock_campaign(l, v, w), timeout, blocking)

    def proclaim(self, value: str) -> None:
        """Changes the value of the calling thread's leadership, its term
        unchanged. LockLost when the leadership is gone; NotSupported on
        stores without it yet."""
        g = self.lock._enter()
        try:
            check(lib.dlock_proclaim(self.lock._l, _value(value)))
        finally:
            g.leave()

    def resign(self) -> None:
        """Gives up the calling thread's leadership (Lock.release())."""
        self.lock._release(lib.dlock_resign)

    @property
    def token(self) -> int:
        """The calling thread's term (0: it does not lead)."""
        return self.lock.token

    @property
    def leading(self) -> bool:
        """Whether the calling thread leads (False once its term is lost)."""
        return self.lock.held and not self.lock.lost

    def close(self) -> None:
        self.lock.close()

    def __enter__(self) -> "Election":
        if not self.campaign():
            raise self.lock._busy("another leader")
        return self

    def __exit__(self, *exc: Any) -> None:
        self.resign()

    def __repr__(self) -> str:
        return "<dlock.Election %r>" % (self.lock.name,)


class Observer:
    """The changes of an election's leader (``Client.observe()``): the
    first state, then each change, as the store tells of it (a thread of
    the library waits; nothing reads on a timer). ``read()`` takes the
    latest state without waiting; iterate (``for leader in observer``) to
    wait for each; ``fileno()`` for select/selectors; ``await
    observer.next_async()`` in asyncio. Close it (or use ``with``)."""

    def __init__(self, client: "Client", name: "Name") -> None:
        from ._client import _name
        self._o: Any = None
        self._client = client
        out = ctypes.c_void_p()
        c = client._enter()
        try:
            check(lib.dlock_observe(c, _name(name), None, None,
                                    ctypes.byref(out)))
        finally:
            client._guard.leave()
        self._o = out.value

    def _live(self) -> Any:
        if self._o is None:
            raise Closed("the observer is closed", N.EINVAL)
        return self._o

    def fileno(self) -> int:
        """Readable while a change is not yet read."""
        return int(lib.dlock_observer_fd(self._live()))

    def read(self) -> Optional[Leader]:
        """The latest state if it changed since the last read, else None."""
        cl = N.LeaderC()
        rc = lib.dlock_observer_read(self._live(), ctypes.byref(cl))
        if rc == N.EBUSY:
            return None
        check(rc)
        return Leader._from(cl)

    def wait(self, timeout: Optional[float] = None) -> Optional[Leader]:
        """Waits (``timeout`` seconds at most; None: as long as it takes)
        for a change and returns it; None at the timeout."""
        p = select.poll()
        p.register(self.fileno(), select.POLLIN)
        if not p.poll(None if timeout is None else int(timeout * 1000)):
            return None
        return self.read()

    def __iter__(self) -> Iterator[Leader]:
        while self._o is not None:
            got = self.wait()
            if got is not None:
                yield got

    async def next_async(self) -> Leader:
        """The next change, awaited in the event loop (the descriptor)."""
        got = self.read()
        if got is not None:
            return got
        loop = asyncio.get_running_loop()
        fd = self.fileno()
        while True:
            fut: "asyncio.Future[None]" = loop.create_future()

            def ready() -> None:
                if not fut.done():
                    fut.set_result(None)
            loop.add_reader(fd, ready)
            try:
                await fut
            finally:
                loop.remove_reader(fd)
            got = self.read()
            if got is not None:
                return got

    def close(self) -> None:
        """Stops the observer (at once) and frees it."""
        if self._o is not None:
            o, self._o = self._o, None
            lib.dlock_observer_close(o)

    def __enter__(self) -> "Observer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

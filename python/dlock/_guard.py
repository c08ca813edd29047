# SPDX-License-Identifier: MIT
"""The life of a Client's or Lock's C memory: calls in flight, and a close
that ends them before it frees anything (python.md, "Closing").

The C library forbids dlock_close() and dlock_client_close() while another
call on the handle or client is in progress (include/dlock.h). A Guard
counts the calls in flight; close() refuses new calls from then on,
shuts the handles (dlock_shutdown(): the waits in progress end at once,
or after one store round trip, and an acquire that was let in just
before close() began but reaches the library later is refused there at
once), waits for the count to reach zero, and only then frees.
"""
import threading
from typing import Any, Callable

from ._errors import Closed

OPEN, CLOSING, FREEING, CLOSED = 0, 1, 2, 3


class _Default:
    def __repr__(self) -> str:
        return "<the lock's timeout>"


# acquire()'s timeout when none is given: the one given to client.lock()
# (or locks(), election()): one rule for with, acquire() and campaign()
DEFAULT: Any = _Default()


class Guard:
    """The calls in flight on one object, and its closing."""

    def __init__(self, what: str) -> None:
        self.cv = threading.Condition(threading.Lock())
        self.state = OPEN
        self.inflight = 0
        self.what = what  # "lock 'x'", "the client": for messages

    @property
    def closing(self) -> bool:
        """Whether close() has begun (read without the mutex: a hint)."""
        return self.state != OPEN

    def closed_error(self, waited: bool = False) -> Closed:
        if waited:
            return Closed("%s was closed while this call waited" % self.what,
                          -4)
        return Closed("%s is closed" % self.what, -4)

    def enter(self) -> None:
        """Lets one call in, or raises Closed."""
        with self.cv:
            if self.state != OPEN:
                raise self.closed_error()
            self.inflight += 1

    def leave(self) -> None:
        with self.cv:
            self.inflight -= 1
            if self.inflight == 0 and self.state != OPEN:
                self.cv.notify_all()

    def begin(self, shut: Callable[[], None]) -> bool:
        """Refuses new calls and shuts the handles (shut, a
        dlock_shutdown() of each, runs under the mutex: it must not block;
        it ends the waits in progress and refuses the acquires still on
        their way into the library). False when another close() began
        first."""
        with self.cv:
            if self.state != OPEN:
                return False
            self.state = CLOSING
            shut()
            return True

    def finish(self, free: Callable[[], None]) -> None:
        """After begin(): waits until no call is in flight (each ends at
        once, or after a store round trip: begin() shut the handles), then
        frees (once, whoever calls). A second caller waits until it is
        done."""
        with self.cv:
            if self.state == OPEN:
                raise AssertionError("finish() before begin()")
            if self.state != CLOSING:
                while self.state != CLOSED:
                    self.cv.wait()
                return
            while self.inflight:
                self.cv.wait()  # leave() notifies at zero
            self.state = FREEING
        try:
            free()
        finally:
            with self.cv:
                self.state = CLOSED
                self.cv.notify_all()

    def mark_closed(self) -> None:
        """Closed without freeing anything (a forked child)."""
        with self.cv:
            self.state = CLOSED
            self.cv.notify_all()

    def cancel_if_open(self, cancel: Callable[[], None]) -> None:
        """Runs cancel (a dlock_cancel()) while nothing can free the
        handle: not once close() began (close() shuts it by itself)."""
        with self.cv:
            if self.state == OPEN:
                cancel()

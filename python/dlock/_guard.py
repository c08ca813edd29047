# SPDX-License-Identifier: MIT
"""The life of a Client's or Lock's C memory: calls in flight, and a close
that ends them before it frees anything (docs/python.md, "Closing").

The C library forbids dlock_close() and dlock_client_close() while another
call on the handle or client is in progress (include/dlock.h). A Guard
counts the calls in flight; close() refuses new calls from then on,
cancels the waits in progress (dlock_cancel(): each ends at once, or after
one store round trip), waits for the count to reach zero, and only then
frees. A call that was let in just before close() began may not have
reached the library's wait when the cancel was sent (the library does
not remember a cancel for acquires that start later): close() sends it
again when the calls have not left within 10 ms, then at growing
intervals up to 0.5 s, until they have.
"""
import threading
from typing import Callable

from ._errors import Closed

OPEN, CLOSING, FREEING, CLOSED = 0, 1, 2, 3


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

    def begin(self, cancel: Callable[[], None]) -> bool:
        """Refuses new calls and cancels the waits in progress (cancel runs
        under the mutex: it must not block). False when another close()
        began first."""
        with self.cv:
            if self.state != OPEN:
                return False
            self.state = CLOSING
            cancel()
            return True

    def finish(self, cancel: Callable[[], None],
               free: Callable[[], None]) -> None:
        """After begin(): waits until no call is in flight, then frees
        (once, whoever calls). A second caller waits until it is done."""
        with self.cv:
            if self.state == OPEN:
                raise AssertionError("finish() before begin()")
            if self.state != CLOSING:
                while self.state != CLOSED:
                    self.cv.wait()
                return
            delay = 0.01
            while self.inflight:
                if not self.cv.wait(delay):
                    # a call let in just before the cancel may have
                    # missed it: cancel again
                    cancel()
                    delay = min(delay * 2, 0.5)
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
        handle: not once close() began (close() cancels by itself)."""
        with self.cv:
            if self.state == OPEN:
                cancel()

# SPDX-License-Identifier: MIT
"""Ctrl-C during a blocking wait (python.md, "Waiting and signals").

Python runs a signal's handler on the main thread, between two bytecodes:
never while that thread waits inside the C library. So while the main
thread waits in an acquire, the signal's wake-up descriptor
(signal.set_wakeup_fd(), which CPython writes a byte to whenever a signal
with a Python handler arrives) is a pipe that a thread of the client's
reads: it cancels the wait (dlock_cancel(): the store's queue is left,
nothing stays behind), and forwards the byte to the descriptor that was
set before (asyncio's, say). The wait returns DLOCK_ECANCELED, the
handler runs as the call returns: KeyboardInterrupt for Ctrl-C; a handler
that returns lets the wait go on for the time left.

The thread starts at the first such wait (an idle client has none) and
ends when the client closes.
"""
import os
import signal
import threading
from typing import Callable, Optional


class Interrupter:
    """One client's: arm() around each blocking wait of the main thread."""

    def __init__(self) -> None:
        self._mu = threading.Lock()
        self._r = -1
        self._w = -1
        self._thread: Optional[threading.Thread] = None
        self._cancel: Optional[Callable[[], None]] = None
        self._forward = -1
        self._pid = os.getpid()

    def _start(self) -> bool:
        if self._thread is not None:
            return True
        try:
            r, w = os.pipe2(os.O_CLOEXEC)
        except OSError:
            return False
        os.set_blocking(w, False)  # set_wakeup_fd() wants it so
        self._r, self._w = r, w
        t = threading.Thread(target=self._run, args=(r,),
                             name="dlock-signals", daemon=True)
        t.start()
        self._thread = t
        return True

    def _run(self, r: int) -> None:
        while True:
            try:
                got = os.read(r, 64)
            except OSError:
                return
            if not got:
                return  # close(): the write end is gone
            with self._mu:
                # under the mutex: disarm() waits for it, so the handle
                # is never cancelled once its call is over
                if self._cancel is not None:
                    self._cancel()
                fwd = self._forward
            if fwd >= 0:
                try:
                    os.write(fwd, got)
                except OSError:
                    pass

    def arm(self, cancel: Callable[[], None]) -> Optional[int]:
        """Before a blocking call on the main thread: a signal now cancels
        it. Returns what disarm() needs, or None when not armed (not the
        main thread, or the descriptor cannot be set)."""
        if threading.current_thread() is not threading.main_thread() or \
                self._pid != os.getpid() or not self._start():
            return None
        with self._mu:
            self._cancel = cancel
        try:
            old = signal.set_wakeup_fd(self._w, warn_on_full_buffer=False)
        except (ValueError, OSError):
            with self._mu:
                self._cancel = None
            return None
        # (a signal in between went to our pipe only: Python has no way to
        # read the descriptor without setting it)
        with self._mu:
            self._forward = old
        return old

    def disarm(self, old: int) -> None:
        """After the call: the descriptor set before is set again."""
        with self._mu:
            self._cancel = None
        try:
            signal.set_wakeup_fd(old)
        finally:
            with self._mu:
                self._forward = -1

    def close(self) -> None:
        """Ends the thread (the client closes)."""
        t, self._thread = self._thread, None
        if t is None or self._pid != os.getpid():
            return
        os.close(self._w)
        t.join(5.0)
        os.close(self._r)
        self._r = self._w = -1

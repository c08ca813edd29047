# SPDX-License-Identifier: MIT
"""asyncio for dlock: each task is an owner, waits run off the event loop,
and a cancelled task leaves nothing in the store (python.md in the package).

A task's hold is made through a C handle of its own, opened with
DLOCK_OWNER_HANDLE: the handle, not a thread, owns it, so the acquire can
run on a worker thread and the release on another. A wait blocks its
worker thread (the library's waits are blocking calls; on the file store,
SQLite, MySQL and PostgreSQL advisory locks they sleep in the kernel or
the server): one thread per waiting task, reused afterwards. A cancelled
task calls dlock_cancel() on its handle, which ends the wait and leaves
the store's queue; if the lock was granted just before, it is released.
"""
import asyncio
import queue
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import _native as N
from ._errors import Closed
from ._guard import Guard
from ._native import errmsg, lib

Result = Tuple[int, str, int]  # rc, the library's message, the token


class _Worker:
    def __init__(self) -> None:
        self.q: "queue.SimpleQueue[Callable[[], None]]" = queue.SimpleQueue()


class Workers:
    """Threads that run blocking library calls for the event loops: an
    idle one takes the next call, and a new one starts when none is idle
    (never a bound: a bounded pool whose threads all wait for locks
    could not run the release that frees them). A thread idle for
    `idle_s` ends. Each worker has its own hand-off queue, so a call is
    never left behind a busy thread."""

    def __init__(self, idle_s: float = 30.0) -> None:
        self._mu = threading.Lock()
        self._idle: "list[_Worker]" = []
        self._idle_s = idle_s

    def submit(self, fn: Callable[[], None]) -> None:
        with self._mu:
            w = self._idle.pop() if self._idle else None
        if w is not None:
            w.q.put(fn)
            return
        w = _Worker()
        w.q.put(fn)
        threading.Thread(target=self._run, args=(w,), name="dlock-aio",
                         daemon=True).start()

    def _run(self, w: _Worker) -> None:
        while True:
            try:
                fn = w.q.get(timeout=self._idle_s)
            except queue.Empty:
                with self._mu:
                    if w in self._idle:
                        self._idle.remove(w)
                        return
                # taken just now by a submit(): its call is on its way
                fn = w.q.get()
            try:
                fn()
            finally:
                with self._mu:
                    self._idle.append(w)


def _cancel(h: Any) -> None:
    lib.dlock_cancel(h)


def _call(h: Any, what: str, wait: int) -> Result:
    """One library call on a worker thread (its message is thread-local:
    read there)."""
    if what == "acquire":
        rc = lib.dlock_acquire(h, wait)
    elif what == "shared":
        rc = lib.dlock_acquire_shared(h, wait)
    else:
        rc = lib.dlock_release(h)
    msg = errmsg() if rc else ""
    return rc, msg, int(lib.dlock_token(h))


async def run(guard: Guard, workers: Workers, h: Any, what: str,
              wait: int = 0) -> Result:
    """Runs _call on a worker and awaits it, counted in flight in the
    lock's guard (Closed once the lock is closing). If the awaiting task
    is cancelled meanwhile, a waiting acquire is cancelled in the library
    (dlock_cancel()), its result awaited all the same, a lock it got
    released; then CancelledError goes on."""
    loop = asyncio.get_running_loop()
    done: "asyncio.Future[Result]" = loop.create_future()

    def finish(res: Result) -> None:
        if not done.done():
            done.set_result(res)

    def work() -> None:
        try:
            res = _call(h, what, wait)
        finally:
            guard.leave()  # from here close() may free h
        try:
            loop.call_soon_threadsafe(finish, res)
        except RuntimeError:
            pass  # the loop is closed: nobody awaits it any more

    guard.enter()
    try:
        workers.submit(work)
    except BaseException:
        guard.leave()
        raise
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        if what != "release":
            guard.cancel_if_open(lambda: _cancel(h))
        res = await _settle(done)
        if what != "release" and res[0] == 0 and not guard.closing:
            # granted before the cancel could end the wait: let it go
            # (a close() that began meanwhile releases it itself)
            try:
                await _settle(_spawn(guard, workers, loop, h))
            except Closed:
                pass
        raise
    except BaseException:
        # GeneratorExit: a pending task destroyed. The call may still run
        # on h: end its wait; close() waits for it before freeing h
        if what != "release":
            guard.cancel_if_open(lambda: _cancel(h))
        raise


def _spawn(guard: Guard, workers: Workers, loop: asyncio.AbstractEventLoop,
           h: Any) -> "asyncio.Future[Result]":
    fut: "asyncio.Future[Result]" = loop.create_future()

    def finish(res: Result) -> None:
        if not fut.done():
            fut.set_result(res)

    def work() -> None:
        try:
            res = _call(h, "release", 0)
        finally:
            guard.leave()
        try:
            loop.call_soon_threadsafe(finish, res)
        except RuntimeError:
            pass

    guard.enter()
    try:
        workers.submit(work)
    except BaseException:
        guard.leave()
        raise
    return fut


async def _settle(fut: "asyncio.Future[Result]") -> Result:
    """Awaits fut to its end, through further cancellations of the task
    (the clean-up must finish; the task stays cancelled)."""
    while True:
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if fut.done():
                return fut.result()


class TaskHolds:
    """A Lock's holds by asyncio task: a C handle each (DLOCK_OWNER_HANDLE)
    with its hold count and token."""

    def __init__(self) -> None:
        self.by_task: Dict["asyncio.Task[Any]", List[Any]] = {}

    def current(self) -> Optional[List[Any]]:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return None
        return self.by_task.get(task) if task is not None else None


__all__ = ["Workers", "run", "TaskHolds", "N"]

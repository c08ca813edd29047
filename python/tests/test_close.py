# SPDX-License-Identifier: MIT
"""close() while other threads or asyncio tasks wait in acquire(): the
waits end with dlock.Closed, close() returns once they have left the C
library, and nothing touches freed memory (on main before issue 34 these
crashed the interpreter: dlock_close() freed a handle still in use)."""
import asyncio
import threading
import time

import pytest

import dlock

WAITERS = 4
ROUNDS = 3
# close() shuts the handle (dlock_shutdown(): a wait ends at once where
# the store or the kernel wakes it, after one store round trip otherwise;
# an acquire still on its way into the library is refused there) and
# waits for them to leave: one client timeout (TIMEOUT) at most, plus
# scheduling slack on a loaded machine
TIMEOUT = 5
CLOSE_BOUND = TIMEOUT + 10


def wait_queued(other, name, bound=20.0):
    """Until the store reports a waiter of name (bounded in time), then a
    pause for the others to follow; a pause when it cannot tell. (Stores
    count one client's waiting threads as one waiter, or not at all.) A
    waiter may still be on its way into the library: close() must cope
    with that as well."""
    until = time.monotonic() + bound
    while time.monotonic() < until:
        w = other.inspect(name).waiters
        if w is None or w >= 1:
            time.sleep(0.3)
            return
        time.sleep(0.01)
    raise AssertionError("the waiters never queued")


def start_waiters(lk, n, results, shared=False):
    def wait():
        try:
            fn = lk.acquire_shared if shared else lk.acquire
            results.append(("returned", fn(None)))
        except BaseException as e:  # noqa: B902 - recorded and checked
            results.append(("raised", e))

    ths = [threading.Thread(target=wait, daemon=True) for _ in range(n)]
    for t in ths:
        t.start()
    return ths


def check_closed(results, ths, n, waited=True):
    for t in ths:
        t.join(CLOSE_BOUND)
        assert not t.is_alive(), "a waiter still waits after close()"
    assert len(results) == n
    for how, what in results:
        assert how == "raised" and isinstance(what, dlock.Closed), \
            (how, what)
        assert isinstance(what, dlock.InvalidArgument)  # a ValueError
        if waited:
            assert "closed while this call waited" in str(what)


# "race": close() at once, while the waiters may still be on their way
# into the library (the cancel must reach them all the same)
@pytest.mark.parametrize("what", ["lock", "client", "race"])
def test_closing_while_threads_wait_ends_their_waits(store, other, name,
                                                     what):
    held = other.lock(name)
    assert held.acquire(0)
    try:
        for _ in range(ROUNDS):
            c = dlock.Client(store.uri, timeout=TIMEOUT)
            lk = c.lock(name)
            results = []
            ths = start_waiters(lk, WAITERS, results)
            if what != "race":
                wait_queued(other, name)
            t0 = time.monotonic()
            if what != "client":
                lk.close()  # the lock, then its client
            c.close()  # closes its locks first
            assert time.monotonic() - t0 < CLOSE_BOUND
            check_closed(results, ths, WAITERS, what != "race")
            # any later call is an error, never freed memory
            with pytest.raises(dlock.Closed):
                lk.acquire(0)
            with pytest.raises(dlock.Closed):
                lk.release()
            with pytest.raises(dlock.Closed):
                lk.token
            with pytest.raises(dlock.Closed):
                c.inspect(name)
            with pytest.raises(dlock.Closed):
                c.lock(name)
            lk.close()
            c.close()  # again: nothing
            assert "closed" in repr(c)
    finally:
        held.release()
    # the cancelled waits left nothing in the store: the next owner is
    # served at once
    b = other.lock(name)
    assert b.acquire(5)
    b.release()


def test_close_racing_acquires_on_their_way_misses_none(store, other, name):
    """Threads let in by the lock just before close() began, still on
    their way to the library's wait when the close shuts the handle (a
    barrier starts them and the close together): each is refused or its
    wait ended, and close() returns, without a cancel sent again on a
    timer. (With a cancel the library does not remember, an acquire that
    joins the handle after it waits forever, and so does close().)"""
    if store.kind in ("mysql", "pg-advisory"):
        # Known defects of these stores, open (issue 34's note): a cancel
        # that reaches the server before it has read the wait's statement
        # is lost (MySQL clears a KILL QUERY as a statement starts;
        # PostgreSQL ignores a cancel while it reads a command), so a
        # close() racing a wait's start can wait for the lock to free.
        pytest.skip("%s: a cancel overtaking the wait's statement is lost "
                    "(a known store defect)" % store.kind)
    held = other.lock(name)
    assert held.acquire(0)
    rounds = 100
    try:
        for r in range(rounds):
            c = dlock.Client(store.uri, timeout=TIMEOUT)
            lk = c.lock(name)
            go = threading.Barrier(WAITERS + 1)
            results = []

            def wait():
                go.wait(30)
                try:
                    results.append(("returned", lk.acquire(None)))
                except BaseException as e:  # noqa: B902 - checked below
                    results.append(("raised", e))

            ths = [threading.Thread(target=wait, daemon=True)
                   for _ in range(WAITERS)]
            for t in ths:
                t.start()
            closer = threading.Thread(target=lk.close, daemon=True)
            go.wait(30)
            t0 = time.monotonic()
            closer.start()
            # CLOSE_BOUND: the shutdown ends each wait at once or after
            # one store round trip (a client timeout at most)
            closer.join(CLOSE_BOUND)
            took = time.monotonic() - t0
            if closer.is_alive():
                held.release()  # let the stuck waiters (and close) end
                closer.join(60)
                raise AssertionError(
                    "round %d: close() still waited %.1f s for an acquire "
                    "that missed the cancel" % (r, took))
            for t in ths:
                t.join(CLOSE_BOUND)
                assert not t.is_alive()
            assert len(results) == WAITERS
            for how, what in results:
                assert how == "raised" and isinstance(what, dlock.Closed), \
                    (how, what)
            c.close()
    finally:
        if held.held:
            held.release()
    b = other.lock(name)
    assert b.acquire(5)  # nothing of the waits is left in the store
    b.release()


def test_closing_a_lock_while_its_threads_hold_and_wait(store, other, name):
    """One thread holds through the lock, others wait in it: close()
    ends the waits and releases the hold; the holder's release() then
    raises Closed."""
    c = dlock.Client(store.uri, timeout=TIMEOUT)
    try:
        lk = c.lock(name)
        got = threading.Event()
        go = threading.Event()
        out = []

        def holder():
            assert lk.acquire(0)
            got.set()
            go.wait(30)
            try:
                lk.release()
                out.append("released")
            except dlock.Closed:
                out.append("closed")

        h = threading.Thread(target=holder, daemon=True)
        h.start()
        assert got.wait(30)
        results = []
        ths = start_waiters(lk, WAITERS, results)
        wait_queued(other, name)
        lk.close()
        check_closed(results, ths, WAITERS)
        go.set()
        h.join(30)
        assert out == ["closed"]
        b = other.lock(name)
        assert b.acquire(5)  # the close released the hold
        b.release()
    finally:
        c.close()


def test_closing_while_asyncio_tasks_wait_ends_their_waits(store, other,
                                                           name):
    held = other.lock(name)
    assert held.acquire(0)

    async def one_round(close_from_thread):
        c = dlock.Client(store.uri, timeout=TIMEOUT)
        lk = c.lock(name)
        tasks = [asyncio.ensure_future(lk.acquire_async())
                 for _ in range(WAITERS)]
        # and tasks cancelled while the close runs
        doomed = [asyncio.ensure_future(lk.acquire_async())
                  for _ in range(2)]
        await asyncio.sleep(0)
        await asyncio.get_running_loop().run_in_executor(
            None, wait_queued, other, name)
        for t in doomed:
            t.cancel()
        t0 = time.monotonic()
        if close_from_thread:
            await asyncio.get_running_loop().run_in_executor(None, c.close)
        else:
            lk.close()  # on the loop's thread: the waits end at once
            c.close()
        assert time.monotonic() - t0 < CLOSE_BOUND
        res = await asyncio.wait_for(
            asyncio.gather(*tasks, *doomed, return_exceptions=True),
            CLOSE_BOUND)
        for r in res[:WAITERS]:
            assert isinstance(r, dlock.Closed), r
        for r in res[WAITERS:]:
            assert isinstance(r, (dlock.Closed, asyncio.CancelledError)), r
        with pytest.raises(dlock.Closed):
            await lk.acquire_async(0)
        with pytest.raises(dlock.Closed):
            await lk.release_async()

    try:
        for i in range(ROUNDS):
            asyncio.run(asyncio.wait_for(one_round(i % 2 == 1), 120))
    finally:
        held.release()
    b = other.lock(name)
    assert b.acquire(5)
    b.release()


def test_closing_a_lock_an_asyncio_task_holds(store, other, name):
    c = dlock.Client(store.uri, timeout=TIMEOUT)
    lk = c.lock(name)

    async def main():
        assert await lk.acquire_async(0)
        assert lk.held
        lk.close()  # releases the task's hold
        with pytest.raises(dlock.Closed):
            await lk.release_async()
        with pytest.raises(dlock.Closed):
            lk.held

    try:
        asyncio.run(asyncio.wait_for(main(), 120))
        b = other.lock(name)
        assert b.acquire(5)
        b.release()
    finally:
        c.close()

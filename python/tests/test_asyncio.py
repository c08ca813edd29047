# SPDX-License-Identifier: MIT
"""asyncio: tasks as owners, waits off the event loop, cancellation that
leaves nothing in the store (no pytest plugin: each test runs its own
event loop with asyncio.run)."""
import asyncio
import time

import pytest

import dlock


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))  # bounded


async def queued(client, name, n=1, bound=20.0):
    """Until the store reports n waiters of name (bounded); False when it
    cannot tell (after a pause long enough to be queued)."""
    until = time.monotonic() + bound
    while True:
        w = client.inspect(name).waiters
        if w is None:
            await asyncio.sleep(0.3)
            return False
        if w >= n:
            return True
        assert time.monotonic() < until, "never queued"
        await asyncio.sleep(0.005)


def test_async_with_holds_and_releases(client, other, name):
    lock = client.lock(name)

    async def main():
        async with lock as held:
            assert held is lock
            assert lock.held and lock.token > 0
            assert other.lock(name).acquire(0) is False
            tok = lock.token
        assert not lock.held
        b = other.lock(name)
        assert b.acquire(0)
        assert b.token > tok
        b.release()

    run(main())


def test_async_with_releases_when_the_body_raises(client, other, name):
    lock = client.lock(name)

    async def main():
        with pytest.raises(KeyError):
            async with lock:
                raise KeyError("boom")
        b = other.lock(name)
        assert b.acquire(0)
        b.release()

    run(main())


def test_tasks_are_owners_of_their_own(client, name):
    lock = client.lock(name)  # one Lock object, shared by the tasks
    order = []

    async def worker(i):
        async with lock:
            order.append(("in", i, lock.token))
            await asyncio.sleep(0.05)
            order.append(("out", i))

    async def main():
        await asyncio.gather(*(worker(i) for i in range(4)))

    run(main())
    # one at a time: every "in" is followed by its own "out"
    for k in range(0, len(order), 2):
        assert order[k][0] == "in" and order[k + 1] == ("out", order[k][1])
    tokens = [e[2] for e in order if e[0] == "in"]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


def test_a_task_reenters_its_own_hold(client, name):
    lock = client.lock(name)

    async def main():
        async with lock:
            tok = lock.token
            async with lock:
                assert lock.hold_count == 2 and lock.token == tok
            assert lock.hold_count == 1
        assert lock.hold_count == 0

    run(main())


def test_waiting_does_not_block_the_event_loop(client, other, name):
    holder = other.lock(name)
    assert holder.acquire(0)
    lock = client.lock(name)
    ticks = []

    async def ticker():
        for _ in range(20):
            ticks.append(time.monotonic())
            await asyncio.sleep(0.01)

    async def main():
        t = asyncio.create_task(ticker())
        got = await lock.acquire_async(0.5)
        await t
        return got

    assert run(main()) is False
    assert len(ticks) == 20  # the loop ran while the task waited
    holder.release()


def test_a_release_wakes_the_waiting_task(client, other, name):
    holder = other.lock(name)
    assert holder.acquire(0)
    lock = client.lock(name)

    async def waiter():
        got = await lock.acquire_async(30)
        woke = time.monotonic()
        await lock.release_async()  # the task's own hold
        return got, woke

    async def main():
        t = asyncio.create_task(waiter())
        await queued(other, name)
        t0 = time.monotonic()
        holder.release()
        got, woke = await t
        assert got is True
        # woken by the store (bound: a busy machine; the wait was 30 s)
        assert woke - t0 < 10
        # a task holds only its own: main never held it
        with pytest.raises(dlock.NotHeld):
            await lock.release_async()

    run(main())


def test_a_cancelled_wait_leaves_no_hold_and_no_queue_entry(store, client,
                                                           other, name):
    holder = other.lock(name, fair=store.has_fair)
    assert holder.acquire(0)
    lock = client.lock(name, fair=store.has_fair)

    async def main():
        t = asyncio.create_task(lock.acquire_async())  # forever
        counted = await queued(other, name)
        t.cancel()
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await t
        assert time.monotonic() - t0 < 5  # ended by the cancel
        if counted:
            until = time.monotonic() + 10
            while other.inspect(name).waiters and time.monotonic() < until:
                await asyncio.sleep(0.01)
            assert other.inspect(name).waiters == 0
        assert not lock._tasks.by_task  # no handle left behind

    run(main())
    holder.release()
    # the release handed the lock to no leftover: a third owner gets it
    with dlock.Client(store.uri) as third:
        x = third.lock(name)
        assert x.acquire(5)
        x.release()


def test_cancel_racing_a_release_leaves_no_hold(store, client, other, name):
    holder = other.lock(name)
    lock = client.lock(name)
    outcomes = []

    async def main():
        for i in range(8):
            assert holder.acquire(0)
            t = asyncio.create_task(lock.acquire_async(30))
            await queued(other, name)
            if i % 2:
                holder.release()
                t.cancel()
            else:
                t.cancel()
                holder.release()
            try:
                # a task cancelled before it could resume with the lock
                # lets it go: either way the task ends without it
                await t
                outcomes.append("got")  # it ran on before the cancel
            except asyncio.CancelledError:
                outcomes.append("cancelled")
            assert not lock._tasks.by_task or t not in lock._tasks.by_task
            # nothing left either way
            assert holder.acquire(5)
            holder.release()

    run(main())
    assert len(outcomes) == 8


def test_wait_for_timeout_leaves_nothing(client, other, name):
    holder = other.lock(name)
    assert holder.acquire(0)
    lock = client.lock(name)

    async def main():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(lock.acquire_async(), 0.3)
        holder.release()
        assert await lock.acquire_async(5)
        await lock.release_async()

    run(main())


def test_async_with_timeout_raises_busy(client, other, name):
    holder = other.lock(name)
    assert holder.acquire(0)
    lock = client.lock(name, timeout=0.2)

    async def main():
        with pytest.raises(dlock.Busy):
            async with lock:
                pytest.fail("entered a held lock")

    run(main())
    holder.release()


def test_lock_lost_surfaces_at_the_end_of_async_with(store, client, other,
                                                     name):
    lost = []
    lock = client.lock(name, ttl=1.5, on_lost=lambda l, t: lost.append(t))

    async def main():
        with pytest.raises(dlock.LockLost) as e:
            async with lock:
                tok = lock.token
                try:
                    other.break_lock(name)
                except dlock.NotSupported:
                    pytest.skip("%s cannot break locks" % store.kind)
                until = time.monotonic() + 30
                while not lost and time.monotonic() < until:
                    await asyncio.sleep(0.02)
        assert e.value.token == tok and lost == [tok]

    run(main())


def test_async_read_write_lock(store, client, other, name):
    rw = client.rwlock(name)
    ro = other.rwlock(name)

    async def main():
        try:
            async with rw.read:
                assert ro.read.acquire(0)  # readers together
                ro.read.release()
                assert ro.write.acquire(0) is False
        except dlock.NotSupported:
            pytest.skip("%s has no shared holds" % store.kind)
        async with rw.write:
            assert ro.read.acquire(0) is False

    run(main())


def test_async_outside_a_task_is_refused(client, name):
    lock = client.lock(name)
    coro = lock.acquire_async()
    with pytest.raises((dlock.InvalidArgument, RuntimeError)):
        coro.send(None)
    coro.close()

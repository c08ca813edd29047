# SPDX-License-Identifier: MIT
"""The lock contract from Python, on the store under test."""
import threading
import time

import pytest

import dlock


def test_acquire_release_token_and_held(store, client, other, name):
    a = client.lock(name)
    b = other.lock(name)
    assert not a.held and a.token == 0
    assert a.acquire(0) is True
    assert a.held and a.hold_count == 1
    t1 = a.token
    assert t1 > 0
    assert b.acquire(0) is False  # another owner: busy, not an error
    info = other.inspect(name)
    assert info.held and store.same_token(info.token, t1)
    a.release()
    assert not a.held and a.token == 0
    assert b.acquire(0) is True
    assert b.token > t1  # fencing tokens strictly increase
    b.release()


def test_with_releases_even_when_the_body_raises(client, other, name):
    lock = client.lock(name)
    with pytest.raises(KeyError):
        with lock as held:
            assert held is lock and lock.held
            assert other.lock(name).acquire(0) is False
            raise KeyError("boom")
    assert not lock.held
    b = other.lock(name)
    assert b.acquire(0) is True
    b.release()


def test_with_timeout_raises_busy(client, other, name):
    a = client.lock(name)
    b = other.lock(name, timeout=0.2)
    with a:
        t0 = time.monotonic()
        with pytest.raises(dlock.Busy) as e:
            with b:
                pytest.fail("entered a held lock")
        # the contract: not before its timeout
        assert time.monotonic() - t0 >= 0.2 - 0.002  # ms clocks
        assert e.value.code == -1 and e.value.name == "DLOCK_EBUSY"
        assert name in e.value.message


def test_timed_wait_gives_up_after_its_timeout(client, other, name):
    a = client.lock(name)
    b = other.lock(name)
    assert a.acquire(0)
    t0 = time.monotonic()
    assert b.acquire(0.3) is False
    assert time.monotonic() - t0 >= 0.3 - 0.002  # the library counts ms
    a.release()


def test_release_wakes_a_waiter_in_another_thread(client, other, name):
    a = client.lock(name)
    b = other.lock(name)
    assert a.acquire(0)
    got = []
    done = threading.Event()

    def wait():
        got.append(b.acquire(30))
        got.append(b.token)
        b.release()
        done.set()

    th = threading.Thread(target=wait)
    th.start()
    # queued, then released: the waiter gets it (woken, long before 30 s)
    deadline = time.monotonic() + 10
    while other.inspect(name).waiters == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    t_release = time.monotonic()
    tok = a.token
    a.release()
    assert done.wait(20)
    th.join()
    assert got[0] is True and got[1] > tok
    # woken by the store, not by a 30 s timeout (bound: generous for a
    # busy machine, far below the wait)
    assert time.monotonic() - t_release < 10


def test_waiting_releases_the_gil(client, other, name):
    a = client.lock(name)
    b = other.lock(name)
    assert a.acquire(0)
    th = threading.Thread(target=lambda: b.acquire(0.5))
    th.start()
    n = 0
    while th.is_alive():  # runs only if the waiter let go of the GIL
        n += 1
    th.join()
    assert n > 1000
    a.release()


def test_reentrant_and_not(client, other, name):
    a = client.lock(name)
    with a:
        t = a.token
        with a:
            assert a.hold_count == 2 and a.token == t
        assert a.hold_count == 1
    assert a.hold_count == 0
    n = client.lock(name, reentrant=False)
    assert n.acquire(0)
    assert n.acquire(0) is False  # a second acquire by the holder
    n.release()


def test_threads_are_different_owners(client, name):
    a = client.lock(name)
    assert a.acquire(0)
    seen = []

    def other_thread():
        seen.append((a.acquire(0), a.held))
        try:
            a.release()
        except dlock.NotHeld as e:
            seen.append(e.code)

    th = threading.Thread(target=other_thread)
    th.start()
    th.join()
    assert seen == [(False, False), -3]
    assert a.held
    a.release()


def test_release_of_a_lock_not_held(client, name):
    with pytest.raises(dlock.NotHeld) as e:
        client.lock(name).release()
    assert e.value.code == -3


def test_lost_hold_raises_lock_lost_and_calls_back(store, client, other,
                                                   name):
    lost = []
    called = threading.Event()

    def on_lost(lock, token):
        lost.append((lock, token))
        called.set()

    a = client.lock(name, ttl=1.5, on_lost=on_lost)  # renewed every 0.5 s
    assert a.acquire(0)
    tok = a.token
    try:
        other.break_lock(name)
    except dlock.NotSupported:
        # a store that cannot break locks: let a lease run out instead
        a.release()
        if not store.has_leases:
            pytest.skip("%s: no break and no leases" % store.kind)
        a = client.lock(name, ttl=0.2, renew=False, on_lost=on_lost)
        assert a.acquire(0)
        tok = a.token
    assert called.wait(30), "the loss was never reported"
    assert lost[0][0] is a and lost[0][1] == tok
    assert a.lost and not a.held and a.token == 0
    with pytest.raises(dlock.LockLost) as e:
        a.release()
    assert e.value.token == tok and e.value.code == -2
    assert not a.lost


def test_lock_lost_in_with_surfaces_at_exit(store, client, other, name):
    lost = threading.Event()
    a = client.lock(name, ttl=1.5, on_lost=lambda lock, token: lost.set())
    with pytest.raises(dlock.LockLost):
        with a:
            try:
                other.break_lock(name)
            except dlock.NotSupported:
                pytest.skip("%s cannot break locks" % store.kind)
            assert lost.wait(30)
    assert not a.held and not a.lost


def test_inspect_and_list(store, client, other, name):
    a = client.lock(name + "/x")
    with a:
        info = other.inspect(name + "/x")
        assert info.held and store.same_token(info.token, a.token)
        assert info.holders == 1
        assert "pid" in info.holder
        try:
            listed = dict(other.list(name + "/"))
        except dlock.NotSupported:
            return
        assert store.same_token(listed[name + "/x"].token, a.token)
    assert not other.inspect(name + "/x").held


def test_bytes_names_are_names(client, other):
    raw = b"py/bytes/\xff\x00x"[:-2] + b"\x01"
    a = client.lock(raw)
    with a:
        assert other.lock(raw).acquire(0) is False
        assert other.inspect(raw).held
    assert a.name == raw  # not UTF-8: handed back as bytes


def test_errors_are_mapped_with_the_library_message(store):
    with pytest.raises(dlock.InvalidArgument) as e:
        dlock.Client("nosuch://x")
    assert "nosuch" in str(e.value) and e.value.code == -4
    with pytest.raises(dlock.ConnectionFailed) as e:
        dlock.Client("redis://secretuser:hunter2@127.0.0.1:1", timeout=2)
    assert "hunter2" not in str(e.value)
    assert isinstance(e.value, ConnectionError)
    with dlock.Client(store.uri) as c:
        with pytest.raises(dlock.InvalidArgument):
            c.lock("")
        with pytest.raises(dlock.InvalidArgument):
            c.lock("x" * 513)
        with pytest.raises(dlock.InvalidArgument):
            c.lock("x", ttl=-1)
        with pytest.raises(dlock.InvalidArgument):
            c.lock("x").acquire(-5)
        with pytest.raises(dlock.InvalidArgument):
            c.lock(42)  # type: ignore[arg-type]
    with pytest.raises(dlock.InvalidArgument):
        c.lock("x")  # closed client


def test_closing_the_client_releases_its_holds(store, other, name):
    c = dlock.Client(store.uri)
    lk = c.lock(name)
    assert lk.acquire(0)
    c.close()
    with pytest.raises(dlock.InvalidArgument):
        lk.acquire(0)
    b = other.lock(name)
    assert b.acquire(5)
    b.release()


def test_read_write_lock(store, client, other, name):
    rw = client.rwlock(name)
    ro = other.rwlock(name)
    try:
        ok = rw.read.acquire(0)
    except dlock.NotSupported:
        pytest.skip("%s has no shared holds" % store.kind)
    assert ok
    assert ro.read.acquire(0)  # readers together
    ro.read.release()
    assert ro.write.acquire(0) is False  # no writer beside a reader
    with pytest.raises(dlock.Deadlock):
        rw.write.acquire(0)  # a reader cannot become the writer
    rw.read.release()
    with ro.write:
        assert rw.read.acquire(0) is False


def test_semaphore(store, client, other, name):
    s1 = client.semaphore(name, 2)
    s2 = other.semaphore(name, 2)
    try:
        ok = s1.acquire(0)
    except dlock.NotSupported:
        pytest.skip("%s has no semaphores" % store.kind)
    assert ok
    assert s2.acquire(0)
    s3 = dlock.Client(store.uri)
    try:
        assert s3.semaphore(name, 2).acquire(0) is False  # both permits out
    finally:
        s3.close()
    s1.release()
    s2.release()


def test_a_lock_owned_by_the_object_is_released_by_any_thread(client, other,
                                                              name):
    a = client.lock(name, owner="lock")
    got = []
    th = threading.Thread(target=lambda: got.append((a.acquire(0), a.token)))
    th.start()
    th.join()
    assert got[0][0] is True and got[0][1] > 0
    assert a.held and a.token == got[0][1]  # seen from this thread too
    assert other.lock(name).acquire(0) is False
    assert "handle" in other.inspect(name).holder
    a.release()  # by another thread than the one that acquired
    assert not a.held
    b = other.lock(name)
    assert b.acquire(0)
    b.release()
    with pytest.raises(dlock.InvalidArgument):
        client.lock(name, owner="task")


def test_a_lock_dropped_in_its_own_callback_is_closed_later(store, client,
                                                            other, name):
    import gc
    import weakref
    dropped = threading.Event()
    box = {}

    def on_lost(lock, token):
        box.clear()  # the last reference but the callback's own
        dropped.set()

    box["lock"] = client.lock(name, ttl=1.5, on_lost=on_lost)
    ref = weakref.ref(box["lock"])
    assert box["lock"].acquire(0)
    try:
        other.break_lock(name)
    except dlock.NotSupported:
        box["lock"].release()
        pytest.skip("%s cannot break locks" % store.kind)
    assert dropped.wait(30)
    deadline = time.monotonic() + 10
    while ref() is not None and time.monotonic() < deadline:
        gc.collect()  # the lock and its callback are a cycle
        time.sleep(0.01)
    assert ref() is None
    # the client still works, and closes the deferred handle at its next
    # call: the name is free
    b = other.lock(name)
    mine = client.lock(name)
    assert mine.acquire(0)
    assert b.acquire(0) is False
    mine.release()

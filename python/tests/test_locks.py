# SPDX-License-Identifier: MIT
"""Several locks at once: Client.locks() (dlock_acquire_all())."""
import threading

import pytest

import dlock


def test_a_set_is_held_whole_in_with(client, other, name):
    names = [name + "/b", name + "/a", name + "/c"]
    with client.locks(names, timeout=5) as held:
        assert held.held and all(t > 0 for t in held.tokens)
        assert [lk.name for lk in held.locks] == names
        for n in names:
            assert not other.lock(n).acquire(0)
    assert not held.held and held.tokens == [0, 0, 0]
    for n in names:
        lk = other.lock(n)
        assert lk.acquire(0)
        lk.release()


def test_a_set_with_a_busy_lock_is_not_had_and_leaves_nothing(client,
                                                               other, name):
    hb = other.lock(name + "/b")
    assert hb.acquire(0)
    s = client.locks([name + "/a", name + "/b"])
    assert not s.acquire(0.2)
    assert not s.locks[0].held
    with pytest.raises(dlock.Busy):
        with client.locks([name + "/a", name + "/b"], timeout=0):
            pass
    la = other.lock(name + "/a")
    assert la.acquire(0)  # not left held by the failed sets
    la.release()
    hb.release()
    assert s.acquire(5)
    s.release()


def test_a_lost_member_raises_lock_lost_at_the_end(store, client, other,
                                                   name):
    lost = threading.Event()
    with pytest.raises(dlock.LockLost):
        with client.locks([name + "/a", name + "/b"],
                          on_lost=lambda lock, token: lost.set()) as held:
            try:
                other.break_lock(name + "/b")
            except dlock.NotSupported:
                pytest.skip("%s cannot break locks" % store.kind)
            assert lost.wait(30)
    assert not held.locks[0].held
    la = other.lock(name + "/a")
    assert la.acquire(0)  # released with the set
    la.release()


def test_one_name_is_not_a_list(client, name):
    with pytest.raises(dlock.InvalidArgument):
        client.locks(name)
    with pytest.raises(dlock.InvalidArgument):
        client.locks([name, name]).acquire(0)


def test_at_least_keeps_the_lock_after_an_early_release(store, client,
                                                        other, name):
    import time
    if not store.caps.get("lease_runs_out"):
        with pytest.raises(dlock.NotSupported):
            client.lock(name, at_least=2)
        return
    with client.lock(name, ttl=1, at_least=2) as held:
        t = time.monotonic()
        assert held.token > 0
    o = other.lock(name)
    assert not o.acquire(0)  # still taken: its at-least time is not over
    assert o.acquire(10)
    assert time.monotonic() - t >= 2 - 0.05
    o.release()


def test_at_most_below_at_least_is_refused(client, name):
    with pytest.raises(dlock.InvalidArgument):
        client.lock(name, at_least=5, at_most=2)


def test_check_measures_the_store(store, client):
    report = client.check()
    assert report.round_trip > 0
    assert all(f.check and f.what and f.fix for f in report.findings)
    if store.kind in ("redis", "pg", "pg-advisory", "mysql"):
        # the store's own clock, on this host
        assert report.clock_offset is not None
        assert abs(report.clock_offset) < 1
    if store.kind == "file":
        assert report.findings == []
    with pytest.raises(dlock.InvalidArgument):
        client.check(ttl=0.001)

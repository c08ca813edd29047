# SPDX-License-Identifier: MIT
"""Leader election: Client.election(), leader(), observe()."""
import asyncio

import pytest

import dlock

# the stores whose observers and proclaim are built (docs/locks.md)
OBSERVABLE = ("redis", "rediss", "redis-sentinel", "redis-cluster", "zk",
              "etcd", "pg", "file", "sqlite")


def test_a_campaign_leads_with_its_value_and_term(client, other, name,
                                                  store):
    assert not client.leader(name).present
    e = client.election(name, value="10.0.0.1:8080")
    with e:
        ld = other.leader(name)
        assert ld.present and ld.value == "10.0.0.1:8080"
        assert store.same_token(ld.term, e.token) and e.leading
        assert not other.election(name).campaign(timeout=0)
    assert not e.leading
    assert not other.leader(name).present
    with pytest.raises(dlock.InvalidArgument):
        e.campaign("two\nlines", timeout=0)


def test_proclaim_and_observers(client, other, name, store):
    e = client.election(name, 60, value="first")
    if store.kind not in OBSERVABLE:
        with pytest.raises(dlock.NotSupported):
            other.observe(name)
        assert e.campaign(timeout=5)
        if store.kind == "redlock":  # a proclaim, no observers
            e.proclaim("second")
            assert other.leader(name).value == "second"
        else:
            with pytest.raises(dlock.NotSupported):
                e.proclaim("second")
        e.resign()
        return
    with other.observe(name) as o:
        first = o.wait(5)
        assert first is not None and not first.present
        assert o.read() is None  # nothing new
        assert e.campaign(timeout=5)
        # bounds: a busy machine's 5 s; the lease is 60 s, so a change
        # seen in time came from the store's wake-up
        got = o.wait(5)
        assert got is not None and got.present and got.value == "first"
        assert got.term == e.token
        e.proclaim("second")
        got = o.wait(5)
        assert got is not None and got.value == "second"
        assert got.term == e.token
        e.resign()
        got = o.wait(5)
        assert got is not None and not got.present


def test_an_observer_in_asyncio(client, other, name, store):
    if store.kind not in OBSERVABLE:
        pytest.skip("no observers on this store yet")
    e = client.election(name, 60, value="async")

    async def run() -> dlock.Leader:
        with other.observe(name) as o:
            first = await o.next_async()
            assert not first.present
            # (a short blocking call in the loop: the change waits for
            # the next await, as any change that comes while busy)
            assert e.campaign(timeout=5)
            return await asyncio.wait_for(o.next_async(), 5)

    got = asyncio.run(run())
    assert got.present and got.value == "async" and got.term == e.token
    e.resign()

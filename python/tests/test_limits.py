# SPDX-License-Identifier: MIT
"""The longest ttl and wait (dlock.TTL_MAX, dlock.WAIT_MAX: the C
library's DLOCK_TTL_MAX and DLOCK_WAIT_MAX, 365 days): honoured at the
limit on every store, InvalidArgument beyond it before any conversion
can overflow (on main before issue 34, ttl=1e13 seconds reached the
store, where MySQL wrote the row already expired)."""
import math
import os
import re
import threading

import pytest

import dlock

DAY = 86400.0
BEYOND = [dlock.TTL_MAX + 0.001, dlock.TTL_MAX + 1, 1e13, 1e20, 1e300,
          10 ** 30, float("inf")]
WRONG = [float("nan"), float("-inf"), -0.001, -5]


def test_the_limits_are_the_library_s():
    assert dlock.TTL_MAX == 365 * DAY
    assert dlock.WAIT_MAX == 365 * DAY
    here = os.path.dirname(os.path.abspath(__file__))
    header = os.path.join(here, "..", "..", "include", "dlock.h")
    with open(header) as f:
        text = f.read()
    for name, value in (("DLOCK_TTL_MAX", dlock.TTL_MAX),
                        ("DLOCK_WAIT_MAX", dlock.WAIT_MAX)):
        m = re.search(r"#define\s+%s\s+(\d+)" % name, text)
        if m:  # (the C side's limits may land later than this package's)
            assert int(m.group(1)) == value * 1000, name


def ttl_beyond_the_limit_is_refused(client, name):
    for ttl in BEYOND + WRONG:
        with pytest.raises(dlock.InvalidArgument) as e:
            client.lock(name, ttl=ttl)
        assert e.value.code == -4
        if not (isinstance(ttl, float) and math.isnan(ttl)) and ttl > 0:
            assert "limit" in str(e.value) and "365 days" in str(e.value)
    lk = client.lock(name)
    assert lk.acquire(0)
    try:
        for ttl in BEYOND + WRONG:
            with pytest.raises(dlock.InvalidArgument):
                lk.extend(ttl)
    finally:
        lk.release()


def wait_beyond_the_limit_is_refused(client, name):
    lk = client.lock(name)
    for wait in BEYOND + WRONG:
        for fn in (lk.acquire, lk.acquire_shared):
            with pytest.raises(dlock.InvalidArgument) as e:
                fn(wait)
            assert e.value.code == -4
        with pytest.raises(dlock.InvalidArgument):
            client.lock(name, timeout=wait)
    with pytest.raises(dlock.InvalidArgument):
        dlock.Client("file:///nonexistent", timeout=1e13)
    assert not lk.held  # nothing was tried
    # None (and -1, as in C) still wait for ever
    assert lk.acquire(None)
    lk.release()
    assert lk.acquire(-1)
    lk.release()


def ttl_at_the_limit_holds(client, other, name):
    lk = client.lock(name, ttl=dlock.TTL_MAX)
    assert lk.acquire(0)
    try:
        # the store did not take it for expired, nor for anything short
        assert other.lock(name).acquire(0) is False
        info = other.inspect(name)
        assert info.held
        if info.ttl is not None:
            assert info.ttl > dlock.TTL_MAX - DAY
        lk.extend(dlock.TTL_MAX)
        assert other.lock(name).acquire(0) is False
    finally:
        lk.release()
    b = other.lock(name)
    assert b.acquire(0)
    b.release()


def wait_at_the_limit_waits(client, other, name):
    """acquire(WAIT_MAX) on a held lock: its deadline did not overflow
    into the past (it waits), and the release wakes it."""
    a = other.lock(name)
    assert a.acquire(0)
    lk = client.lock(name)
    got = []
    started = threading.Event()

    def wait():
        started.set()
        try:
            got.append(lk.acquire(dlock.WAIT_MAX))
        except dlock.DlockError as e:
            got.append(e)

    th = threading.Thread(target=wait, daemon=True)
    th.start()
    assert started.wait(30)
    th.join(0.5)  # it still waits: the deadline is 365 days away
    assert th.is_alive() and got == [], got
    a.release()
    # woken by the store: at once on every store; 30 s on a loaded machine
    th.join(30)
    assert got == [True]
    # the holder is the waiting thread: release from another thread is
    # NotHeld; the client's close releases it
    with pytest.raises(dlock.NotHeld):
        lk.release()
    lk.close()
    b = other.lock(name)
    assert b.acquire(5)
    b.release()


def test_a_ttl_at_the_limit_holds_and_beyond_is_refused(store, client,
                                                        other, name):
    ttl_beyond_the_limit_is_refused(client, name)
    ttl_at_the_limit_holds(client, other, name)


def test_a_wait_at_the_limit_waits_and_beyond_is_refused(store, client,
                                                         other, name):
    wait_beyond_the_limit_is_refused(client, name)
    wait_at_the_limit_waits(client, other, name)

# SPDX-License-Identifier: MIT
"""The in-process store as a Python user's test double (mem://)."""
import threading

import dlock


def test_mem_is_a_store_of_the_process():
    with dlock.Client("mem://py-test") as a, \
            dlock.Client("mem://py-test") as b:
        la = a.lock("job", ttl=5, owner="lock")
        lb = b.lock("job", ttl=5)
        assert la.acquire(0) and not lb.acquire(0)
        first = la.token
        # another thread lets go: the waiter is woken, with a greater token
        t = threading.Timer(0.2, la.release)
        t.start()
        assert lb.acquire(5) and lb.token > first
        lb.release()
        t.join()
        # another space is another store
        with dlock.Client("mem://py-other") as c:
            with c.lock("job"):
                pass

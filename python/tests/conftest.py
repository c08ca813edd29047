# SPDX-License-Identifier: MIT
"""The store under test: real servers started by the C test harness
(th_serve KIND, tests/harness/serve.c), the same way as for the C suites.

Environment (set by tests/CMakeLists.txt):
  DLOCK_PY_STORE   the store kind (file, redis, zk, etcd, ...)
  DLOCK_TH_SERVE   the th_serve program
  DLOCK_CLI        the dlock command (interop tests)
  DLOCK_LIBRARY    the libdlock.so.0 under test
"""
import os
import subprocess
from dataclasses import dataclass
from typing import Dict

import pytest


@dataclass
class Store:
    kind: str
    uri: str
    caps: Dict[str, int]

    @property
    def has_fair(self) -> bool:
        return bool(self.caps.get("has_fair"))

    @property
    def has_leases(self) -> bool:
        return bool(self.caps.get("has_leases"))

    def same_token(self, seen: int, token: int) -> bool:
        """A token the store reports (inspect, list, status) against the
        holder's: equal, except on Redlock, where the store reports the
        highest node counter, within the same counter as the token
        (docs/redlock.md)."""
        if self.kind != "redlock":
            return seen == token
        return token >> 6 <= seen >> 6 < (token >> 6) + 1000000


@pytest.fixture(scope="session")
def store():
    kind = os.environ.get("DLOCK_PY_STORE", "file")
    serve = os.environ["DLOCK_TH_SERVE"]
    p = subprocess.Popen([serve, kind], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
    try:
        uri = p.stdout.readline().strip()
        words = p.stdout.readline().split()
        assert uri, "th_serve %s printed no URI (exit %s)" % (kind, p.poll())
        caps = {}
        for w in words:
            k, _, v = w.partition("=")
            caps[k] = int(v) if v.lstrip("-").isdigit() else v
        yield Store(kind, uri, caps)
    finally:
        p.stdin.close()
        try:
            p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.fixture
def client(store):
    import dlock
    with dlock.Client(store.uri, timeout=10) as c:
        yield c


@pytest.fixture
def other(store):
    """A second client: another owner, as another process would be."""
    import dlock
    with dlock.Client(store.uri, timeout=10) as c:
        yield c


@pytest.fixture
def name(request):
    """A lock name of the test's own."""
    return "py/" + request.node.name

# SPDX-License-Identifier: MIT
"""The HTTP convention of docs/fencing.md, with its reference service
(examples/fencing/http_service.py): a holder whose lease ran out while it
did not run (no renewal: renew=False, as a paused process renews
nothing), a new holder that writes, the old one writing with its old
token: 409, and the service keeps the new holder's write."""
import importlib.util
import os
import threading
import time
import urllib.error
import urllib.request

import pytest

import dlock

HERE = os.path.dirname(os.path.abspath(__file__))
SERVICE = os.path.join(HERE, "..", "..", "examples", "fencing",
                       "http_service.py")


@pytest.fixture
def service(tmp_path):
    spec = importlib.util.spec_from_file_location("http_service", SERVICE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    srv = mod.serve(0, str(tmp_path / "fence.db"))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield "http://127.0.0.1:%d" % srv.server_address[1]
    finally:
        srv.shutdown()
        srv.server_close()


def put(url, token, body):
    req = urllib.request.Request(url, data=body, method="PUT")
    if token is not None:
        req.add_header("Dlock-Fencing-Token", str(token))
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def test_a_stale_holders_http_write_is_refused(store, client, other, name,
                                              service):
    if not store.caps.get("lease_runs_out"):
        pytest.skip("%s: a hold that nobody renews does not end"
                    % store.kind)
    url = service + "/" + name.replace("/", "_")
    a = client.lock(name, ttl=0.5, renew=False)
    assert a.acquire(5)
    ta = a.token
    b = other.lock(name)
    assert b.acquire(10)  # a's lease ran out: nobody renewed it
    tb = b.token
    assert tb > ta
    assert put(url, tb, b"from B") == 204
    b.release()
    time.sleep(0.05)
    assert put(url, ta, b"from A") == 409  # the stale holder, refused
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.read() == b"from B"
        assert r.headers["Dlock-Fencing-Token"] == str(tb)
    assert put(url, None, b"no token") == 428
    with pytest.raises(dlock.LockLost):
        a.release()  # its work was not protected

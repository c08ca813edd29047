#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""A reference HTTP service that fences its writes (docs/fencing.md).

    python3 http_service.py [--port 8080] [--db fence.db]

PUT /NAME with the header `Dlock-Fencing-Token: T` stores the body under
NAME unless a token higher than T has written NAME: 409 Conflict then,
and nothing is written. No header: 428 Precondition Required. GET /NAME
returns the body and, in `Dlock-Fencing-Token`, the token that wrote it.

The check and the write are one SQLite transaction (BEGIN IMMEDIATE),
with the fence table and trigger of sqlite.sql beside this file: the
kept token survives restarts and is kept per resource. Standard library
only; a sketch of what a service does, not a production server.
"""
import argparse
import os
import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HEADER = "Dlock-Fencing-Token"
HERE = os.path.dirname(os.path.abspath(__file__))


def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA busy_timeout = 10000")
    with open(os.path.join(HERE, "sqlite.sql")) as f:
        db.executescript(f.read())
    db.execute("CREATE TABLE IF NOT EXISTS docs (name TEXT PRIMARY KEY, "
               "body BLOB NOT NULL)")
    return db


class Handler(BaseHTTPRequestHandler):
    db: sqlite3.Connection
    mu = threading.Lock()  # one sqlite3 connection: one request at a time

    def _send(self, code: int, body: bytes, token: str = "") -> None:
        self.send_response(code)
        if token:
            self.send_header(HEADER, token)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_PUT(self) -> None:  # noqa: N802 (http.server's name)
        name = self.path.lstrip("/")
        raw = self.headers.get(HEADER)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if raw is None:
            return self._send(428, b"a fencing token is required\n")
        if not raw.isdigit() or not 0 < int(raw) < 2 ** 63:
            return self._send(400, b"a fencing token is a number\n")
        with self.mu:
            try:
                self.db.execute("BEGIN IMMEDIATE")
                self.db.execute(
                    "INSERT INTO dlock_fence (resource, token) VALUES (?, ?) "
                    "ON CONFLICT (resource) DO UPDATE SET token = "
                    "excluded.token", (name, int(raw)))
                self.db.execute(
                    "INSERT INTO docs (name, body) VALUES (?, ?) ON CONFLICT "
                    "(name) DO UPDATE SET body = excluded.body", (name, body))
                self.db.execute("COMMIT")
            except sqlite3.DatabaseError as e:
                self.db.execute("ROLLBACK")
                if "stale fencing token" in str(e):
                    return self._send(409, b"stale fencing token: a newer "
                                           b"holder has written\n")
                raise
        self._send(204, b"")

    def do_GET(self) -> None:  # noqa: N802
        name = self.path.lstrip("/")
        with self.mu:
            row = self.db.execute(
                "SELECT d.body, f.token FROM docs d JOIN dlock_fence f ON "
                "f.resource = d.name WHERE d.name = ?", (name,)).fetchone()
        if row is None:
            return self._send(404, b"")
        self._send(200, bytes(row[0]), str(row[1]))

    def log_message(self, *args: object) -> None:
        pass


def serve(port: int, db_path: str) -> ThreadingHTTPServer:
    Handler.db = open_db(db_path)
    return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--db", default="fence.db")
    a = ap.parse_args()
    serve(a.port, a.db).serve_forever()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Deletion events survive a crash: nothing is missing, and repeats are the same event.

On SQLite and on PostgreSQL: registers a receiver with `plantstore webhooks add`, serves
`plantstore`, and has 16 clients delete while the receiver first answers 500s, then 2xx.
Mid-stream the service is killed with SIGKILL and started again. Then every deletion log
entry must have reached the receiver, each request's signature verified by the reference
implementation (the `standardwebhooks` package from PyPI), and every repeat of a
webhook-id must carry the same body. Exits 1 on any failure.

Run from the repository root after `cargo test` (it uses target/debug/plantstore), with a
Python that has standardwebhooks:
    python3 -m venv target/webhook-venv && target/webhook-venv/bin/pip install standardwebhooks==1.1.0
    PLANTSTORE_CI_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        target/webhook-venv/bin/python tests/deploy/webhooks.py
"""

import argparse
import collections
import http.server
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from standardwebhooks import Webhook, WebhookVerificationError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.common import fail, free_port, psql, wait_until  # noqa: E402
from toolkit.service import Service, cli, prepare_database  # noqa: E402
from fixtures import Clients, psql_or_sqlite  # noqa: E402

WHAT = "webhooks"
PLANTS = 200_000
FAILING_FIRST = 30  # requests the receiver answers 500 before it accepts


class Receiver(http.server.ThreadingHTTPServer):
    """Answers 500 to the first FAILING_FIRST POSTs, then 204; keeps each one's webhook-id,
    body and whether the reference implementation verified it."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.secret = None
        self.got = []  # (webhook-id, body, verified, accepted)
        self.lock = threading.Lock()
        self.daemon_threads = True

    def handle_error(self, request, client_address):
        pass  # the service killed mid-request resets its connections: expected here

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}/hooks"


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        server = self.server
        try:
            Webhook(server.secret).verify(body, dict(self.headers))
            verified = True
        except WebhookVerificationError:
            verified = False
        with server.lock:
            accepted = len(server.got) >= FAILING_FIRST
            server.got.append((self.headers.get("webhook-id"), body, verified, accepted))
        self.send_response(204 if accepted else 500)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


def run(binary, url, work, label):
    receiver = Receiver()
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    token = prepare_database(binary, url, PLANTS)
    receiver.secret = cli(binary, url, "webhooks", "add", receiver.url).split()[-1]
    port = free_port()
    instance = Service(label, binary, url, port, work,
                       PLANTSTORE_WEBHOOK_RETRY_MIN="100ms", PLANTSTORE_WEBHOOK_RETRY_MAX="1s",
                       RUST_LOG="info")
    if not instance.start():
        fail(WHAT, f"{label}: the service did not get ready")
    try:
        with Clients(16, port, token, PLANTS) as clients:
            time.sleep(1.5)
            instance.kill()
            killed_at = len(receiver.got)
            if not instance.start():
                fail(WHAT, f"{label}: the service did not start again after SIGKILL")
            time.sleep(1.5)
        counts = clients.counts()
        logged = {int(x) for x in psql_or_sqlite(url, "SELECT id FROM plantstore_deletions")}
        wanted = {f"deletion_{i}" for i in logged}
        accepted = lambda: {got[0] for got in list(receiver.got) if got[3]}
        if not wait_until(lambda: wanted <= accepted(), 60):
            missing = sorted(wanted - accepted())
            fail(WHAT, f"{label}: {len(missing)} of {len(wanted)} events never accepted, "
                       f"such as {missing[:5]}")
    finally:
        instance.kill()
        receiver.shutdown()
    got = list(receiver.got)
    unverified = [g[0] for g in got if not g[2]]
    bodies = collections.defaultdict(set)
    for webhook_id, body, _, _ in got:
        bodies[webhook_id].add(body)
    changed = [i for i, b in bodies.items() if len(b) > 1]
    unknown = set(bodies) - wanted
    sent = collections.Counter(g[0] for g in got if g[3])
    repeats = sum(n - 1 for n in sent.values())
    print(f"{label}: {counts.get(204, 0)} deletes answered 204 ({dict(counts)}); "
          f"SIGKILL after {killed_at} requests to the receiver; {len(got)} requests in all, "
          f"{FAILING_FIRST} answered 500; {len(wanted)} events, every one accepted; "
          f"{repeats} accepted more than once")
    if unverified:
        fail(WHAT, f"{label}: {len(unverified)} signatures the reference refused: {unverified[:5]}")
    if changed:
        fail(WHAT, f"{label}: {len(changed)} webhook-ids came with different bodies: {changed[:5]}")
    if unknown:
        fail(WHAT, f"{label}: events for no deletion log entry: {sorted(unknown)[:5]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="target/debug/plantstore")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    admin = os.environ.get("PLANTSTORE_CI_POSTGRES_URL",
                           "postgres://postgres@127.0.0.1:5432/postgres")
    with tempfile.TemporaryDirectory() as work:
        run(binary, f"sqlite://{work}/plantstore.db?mode=rwc", work, "sqlite")
        name = f"plantstore_webhooks_{uuid.uuid4().hex}"
        psql(admin, f"CREATE DATABASE {name}")
        try:
            run(binary, f"{admin.rsplit('/', 1)[0]}/{name}", work, "postgres")
        finally:
            psql(admin, f"DROP DATABASE {name} WITH (FORCE)")
    print("ok: every committed delete reached the receiver, signed; repeats were the same event")


if __name__ == "__main__":
    main()

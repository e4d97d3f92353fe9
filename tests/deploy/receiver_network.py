#!/usr/bin/env python3
"""A receiver's network fails, and deletion events come through.

The receiver runs on a test host of its own: a network namespace joined to this one by a
veth pair, with nftables inside it. Under a steady stream of deletes (and of restores
followed by another delete of the same plant), its link goes silent for 15 s (every packet
dropped, no reset), then loses 20 % of packets at random for 15 s, then heals. On SQLite and
on PostgreSQL:
- every delete is answered 204, and its latency while the link is down stays that of a
  delete (the delete path does not wait on delivery);
- every event arrives after the heal, within the attempt timeout and the longest backoff
  (an attempt that outlived its timeout would hold back its plant's next event);
- each plant's events arrive in the order they were committed;
- every request verifies with the reference library (`standardwebhooks`);
- repeats (an attempt whose answer was lost) are counted and printed.

Needs root (ip netns, nft); run from the repository root after `cargo test`:
    PLANTSTORE_CI_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        target/webhook-venv/bin/python tests/deploy/receiver_network.py
"""

import argparse
import collections
import http.client
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.common import fail, free_port, wait_until  # noqa: E402
from toolkit.service import Service, cli, prepare_database  # noqa: E402
from fixtures import Deleter, on_both_backends_behind_a_test_host, psql_or_sqlite  # noqa: E402

WHAT = "receiver network"
SUBNET = "10.77.0"
RECEIVER_ADDRESS = f"{SUBNET}.2"  # the test host's, as TestHost gives it
PHASES = [("silent", "drop"), ("lossy", "numgen random mod 100 < 20 drop"), ("healed", None)]
PHASE_S = 15
TIMEOUT_S = 3
RETRY_MAX_S = 5


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, request, client_address):
        pass  # connections cut by the lossy link: expected here


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        from standardwebhooks import Webhook, WebhookVerificationError
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        try:
            Webhook(self.server.secret).verify(body, dict(self.headers))
            verified = True
        except WebhookVerificationError:
            verified = False
        line = json.dumps({"id": self.headers.get("webhook-id"), "at": time.time(),
                           "verified": verified})
        with self.server.lock:
            self.server.log.write(line + "\n")
            self.server.log.flush()
        self.send_response(204)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *_):
        pass


def serve(port, secret, log):
    """Inside the test host: the receiver, writing each request as a line of JSON."""
    server = Receiver((RECEIVER_ADDRESS, port), Handler)
    server.secret, server.lock, server.log = secret, threading.Lock(), open(log, "a")
    server.serve_forever()


def scenario(binary, url, work, label, host):
    token = prepare_database(binary, url, 100_000)
    port = free_port()
    added = cli(binary, url, "webhooks", "add", f"http://{RECEIVER_ADDRESS}:{port}/hooks")
    secret = added.split()[-1]
    log = os.path.join(work, f"{label}-received.jsonl")
    receiver = subprocess.Popen(
        ["ip", "netns", "exec", host.name, sys.executable, os.path.abspath(__file__),
         "--serve", str(port), "--secret", secret, "--log", log],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(work, f"{label}-receiver.err"), "w"))
    service_port = free_port()
    instance = Service(label, binary, url, service_port, work, RUST_LOG="info",
                       PLANTSTORE_WEBHOOK_TIMEOUT=f"{TIMEOUT_S}s",
                       PLANTSTORE_WEBHOOK_RETRY_MIN="200ms",
                       PLANTSTORE_WEBHOOK_RETRY_MAX=f"{RETRY_MAX_S}s")
    if not instance.start():
        fail(WHAT, f"{label}: the service did not get ready")
    deleter = Deleter(binary, url, service_port, token)
    try:
        host.link(None)
        deleter.thread.start()
        time.sleep(3)
        for phase, rule in PHASES:
            host.link(rule)
            deleter.phase = phase
            if phase == "healed":
                healed_at = time.time()
                time.sleep(3)
            else:
                time.sleep(PHASE_S)
        deleter.stop.set()
        deleter.thread.join()
        stopped_at = time.time()
        logged = psql_or_sqlite(url, "SELECT id FROM plantstore_deletions")
        restores = psql_or_sqlite(url, "SELECT id FROM plantstore_deletions "
                                       "WHERE restored_at IS NOT NULL")
        wanted = {f"deletion_{i}" for i in logged} | {f"restore_{i}" for i in restores}

        def received():
            with open(log) as f:
                return [json.loads(line) for line in f if line.strip()]
        if not wait_until(lambda: wanted <= {r["id"] for r in received()}, 120):
            missing = sorted(wanted - {r["id"] for r in received()})
            fail(WHAT, f"{label}: {len(missing)} of {len(wanted)} events never arrived, "
                       f"such as {missing[:5]}")
        all_in = time.time()
    finally:
        deleter.stop.set()
        instance.kill()
        receiver.terminate()
        receiver.wait()
    got = received()
    first = {}
    for r in got:
        first.setdefault(r["id"], r["at"])
    counts = collections.Counter(r["id"] for r in got)
    repeats = sum(n - 1 for n in counts.values())
    statuses = collections.Counter(status for _, status, _ in deleter.answers)
    latency = deleter.latency_by_phase()
    last_event = max(first.values())
    print(f"{label}: {len(deleter.answers)} deletes {dict(statuses)}; latency p50/p99 ms by "
          + ", ".join(f"{p} {a * 1000:.1f}/{b * 1000:.1f}" for p, (a, b) in latency.items())
          + f"; {len(wanted)} events, {len(got)} requests, {repeats} repeats; the last "
          f"arrived {last_event - healed_at:.1f} s after the heal")
    if set(statuses) != {204}:
        fail(WHAT, f"{label}: deletes answered {dict(statuses)}")
    worst = max(b for _, b in latency.values())
    if worst > 1.0:
        fail(WHAT, f"{label}: a delete's p99 reached {worst:.3f} s while the receiver failed")
    if any(not r["verified"] for r in got):
        fail(WHAT, f"{label}: requests the reference library refused")
    if last_event - healed_at > TIMEOUT_S + RETRY_MAX_S + 5:
        fail(WHAT, f"{label}: events still arrived {last_event - healed_at:.1f} s after the heal")
    # Per plant: its delete, its restore, its delete again, in that order.
    out_of_order = []
    for plant in deleter.restored:
        entries = sorted(int(i) for i in psql_or_sqlite(
            url, f"SELECT id FROM plantstore_deletions WHERE plant_id = {plant}"))
        order = [f"deletion_{entries[0]}", f"restore_{entries[0]}", f"deletion_{entries[1]}"]
        times = [first[i] for i in order]
        if times != sorted(times):
            out_of_order.append(plant)
    print(f"{label}: {len(deleter.restored)} plants deleted, restored and deleted again; "
          f"{len(out_of_order)} out of order; every event in {all_in - stopped_at:.1f} s after "
          f"the last delete")
    if out_of_order:
        fail(WHAT, f"{label}: plants whose events arrived out of order: {out_of_order[:5]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="target/debug/plantstore")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--secret", help=argparse.SUPPRESS)
    parser.add_argument("--log", help=argparse.SUPPRESS)
    parser.add_argument("--work", help="keep the logs in this folder")
    args = parser.parse_args()
    if args.serve:
        return serve(args.serve, args.secret, args.log)
    binary = os.path.abspath(args.binary)
    on_both_backends_behind_a_test_host(
        SUBNET, args.work, "network",
        lambda url, label, work, host: scenario(binary, url, work, label, host))
    print("ok: through a silent link and a lossy one, every event arrived after the heal, "
          "in order per plant, and deletes were answered as usual")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The path to a stream destination's broker fails, and every event is in the stream once.

nats-server runs on a test host of its own: a network namespace joined to this one by a veth
pair, with nftables inside it. Under a steady stream of deletes (and of restores followed by
another delete of the same plant), the link goes silent for 15 s (every packet dropped, no
reset), then loses 20 % of packets at random for 15 s, then heals. On SQLite and on
PostgreSQL:
- every delete is answered 204, and its latency while the link is down stays that of a
  delete (the delete path does not wait on the broker);
- while the link is silent, `streams list` shows the destination failing, with the reason;
- once the deletes stop (3 s after the heal), nothing is pending within DRAINED_WITHIN_S,
  the attempt timeout plus the longest backoff, and a consumer reading the whole stream
  finds every log event exactly once, each plant's in log order. A publish that times out
  drops its connection, so the attempt after the heal connects anew rather than waiting
  for the silent one to recover on TCP's retransmission schedule (once 16 s after the
  heal, before). The time is printed.

Needs root (ip netns, nft) and a Python with nats-py; run from the repository root after
`cargo test`:
    PLANTSTORE_CI_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        target/webhook-venv/bin/python tests/deploy/stream_network.py
"""

import argparse
import collections
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from toolkit.common import fail, free_port, wait_until  # noqa: E402
from toolkit.service import Service, cli, prepare_database  # noqa: E402
from broker import Broker, check_stream, destination, wait_for_nothing_pending  # noqa: E402
from fixtures import Deleter, on_both_backends_behind_a_test_host  # noqa: E402

WHAT = "stream network"
PHASES = [("silent", "drop"), ("lossy", "numgen random mod 100 < 20 drop"), ("healed", None)]
PHASE_S = 15
TIMEOUT_S = 3
RETRY_MAX_S = 5
DRAINED_WITHIN_S = TIMEOUT_S + RETRY_MAX_S


def scenario(binary, url, work, label, host):
    token = prepare_database(binary, url, 100_000)
    host.link(None)
    broker = Broker(work, WHAT, address=host.address, host=host)
    instance = None
    try:
        cli(binary, url, "streams", "add", broker.url, "--stream", Broker.STREAM)
        instance = Service(label, binary, url, free_port(), work, RUST_LOG="info",
                           PLANTSTORE_WEBHOOK_TIMEOUT=f"{TIMEOUT_S}s",
                           PLANTSTORE_WEBHOOK_RETRY_MIN="200ms",
                           PLANTSTORE_WEBHOOK_RETRY_MAX=f"{RETRY_MAX_S}s")
        if not instance.start():
            fail(WHAT, f"{label}: the service did not get ready")
        deleter = Deleter(binary, url, instance.port, token)
        deleter.thread.start()
        time.sleep(3)
        failing = None
        for phase, rule in PHASES:
            host.link(rule)
            deleter.phase = phase
            started = time.monotonic()
            if phase == "silent":
                if wait_until(lambda: destination(binary, url).get("state") == "failing",
                              PHASE_S):
                    failing = destination(binary, url)
                    print(f"{label}: silent link: the destination {failing['state']}, "
                          f"last error: {failing['last_error']}")
                time.sleep(max(0.0, PHASE_S - (time.monotonic() - started)))
            elif phase == "healed":
                healed_at = started
                time.sleep(3)
            else:
                time.sleep(PHASE_S)
        deleter.stop.set()
        deleter.thread.join()
        if not failing:
            fail(WHAT, f"{label}: the destination never showed failing while the link was silent")
        drained = wait_for_nothing_pending(binary, url, DRAINED_WITHIN_S)
        after_heal = time.monotonic() - healed_at
        statuses = collections.Counter(status for _, status, _ in deleter.answers)
        latency = deleter.latency_by_phase()
        print(f"{label}: {len(deleter.answers)} deletes {dict(statuses)}; latency p50/p99 ms by "
              + ", ".join(f"{p} {a * 1000:.1f}/{b * 1000:.1f}" for p, (a, b) in latency.items())
              + f"; {len(deleter.restored)} plants deleted, restored and deleted again; "
              f"nothing pending {after_heal:.1f} s after the heal")
        if not drained:
            fail(WHAT, f"{label}: events still pending {after_heal:.0f} s after the heal")
        if set(statuses) != {204}:
            fail(WHAT, f"{label}: deletes answered {dict(statuses)}")
        worst = max(b for _, b in latency.values())
        if worst > 1.0:
            fail(WHAT, f"{label}: a delete's p99 reached {worst:.3f} s while the broker was "
                       "unreachable")
        check_stream(binary, url, url, broker, f"{label}, a silent then lossy link to the broker")
    finally:
        if instance:
            instance.kill()
        broker.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--binary", default="target/debug/plantstore")
    parser.add_argument("--work", help="keep the logs in this folder")
    args = parser.parse_args()
    binary = os.path.abspath(args.binary)
    on_both_backends_behind_a_test_host(
        "10.78.0", args.work, "stream-network",
        lambda url, label, work, host: scenario(binary, url, work, label, host))
    print("ok: through a silent link to the broker and a lossy one, every event was in the "
          "stream once after the heal, in order per plant, and deletes were answered as usual")


if __name__ == "__main__":
    main()

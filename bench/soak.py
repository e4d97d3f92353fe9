#!/usr/bin/env python3
"""Soak: a long run of mixed hits, misses and 401s at 64 connections on each backend, with
one webhook endpoint receiving every delete's event.

Start it through bench/soak (which builds and installs what is missing). For each backend it
serves a fresh database under three concurrent wrk streams (4 connections deleting existing
plants, 30 asking for missing ones with the token, 30 without a token) for SOAK_SECONDS
(default 600), with one webhook endpoint (nginx `return 204`, logging when each event came),
samples the service every 5 s, and fails unless:
- every answer was the expected one (204, 404, 401) and no socket error or timeout happened;
- RSS at the end is less than 10 % above RSS after the warm-up (the first tenth of the run,
  at least 30 s);
- open file descriptors and PostgreSQL connections stayed flat after the warm-up (within 4;
  file descriptors within 4 more than the endpoint's connections);
- every delete's event reached the receiver, with a lag from its commit of at most 2 s at
  the 99th percentile.
It prints RSS at the first sample, after the warm-up, at its peak (VmHWM) and at the end.
Never run by CI: it takes 2 x SOAK_SECONDS.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

# The checkout stays as the soak found it: no __pycache__ folder appears beside the packages.
sys.dont_write_bytecode = True
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from toolkit.processes import PROCS  # noqa: E402
from toolkit.service import Service  # noqa: E402
from harness.builds import Build  # noqa: E402
from harness.common import env_int  # noqa: E402
from harness.databases import Postgres, Sqlite  # noqa: E402
from harness.load import fmt_unexpected, run_wrk, trim_log, unexpected  # noqa: E402
from harness.webhooks import commit_times, start_receiver  # noqa: E402

STREAMS = {"hit": 4, "miss": 30, "noauth": 30}
EXPECT = {"hit": "204", "miss": "404", "noauth": "401"}
# Ids reserved per second for the hit stream (4 connections delete a few thousand a second).
HIT_IDS_PER_SECOND = 8_000
SAMPLE_S = 5.0
FLAT = 4
# The endpoint's connections come and go with delivery: one per request in flight over
# HTTP/1.1, up to the service's 64 (src/webhooks/delivery_loop.rs), each closed after 2 s idle.
# Open file descriptors may swing by that many on top of FLAT.
WEBHOOK_CONNECTIONS = 64
LAG_P99_LIMIT_S = 2.0
DRAIN_S = 120


def sampler(service: Service, pg: Postgres | None, stop: threading.Event, samples: list):
    started = time.monotonic()
    while not stop.wait(SAMPLE_S):
        connections = None
        if pg is not None:
            connections = pg.scalar(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = 'plantstore'"
            )
        samples.append(
            (time.monotonic() - started, service.rss_mib(), service.descriptors(), connections)
        )


def spread(values: list) -> int:
    values = [v for v in values if v is not None]
    return (max(values) - min(values)) if values else 0


def soak(backend: str, plantstore: Build, seconds: int, work: Path, pg_admin: str) -> bool:
    pg = None
    if backend == "postgres":
        pg = Postgres(pg_admin, "plantstore_soak")
        pg.recreate()
        url = pg.url
    else:
        sq = Sqlite(work / "soak.db")
        sq.remove()
        url = sq.url
    rows = seconds * HIT_IDS_PER_SECOND
    shutil.rmtree(work / f"receiver-soak-{backend}", ignore_errors=True)
    receiver, rport, rdir = start_receiver(work, f"soak-{backend}", tls=False)
    try:
        plantstore.cli(url, "migrate")
        plantstore.cli(url, "seed", "--count", str(rows))
        token = plantstore.cli(url, "token", "create", "--name", "soak").strip().splitlines()[-1]
        plantstore.cli(url, "webhooks", "add", f"http://127.0.0.1:{rport}/hooks")
        service = plantstore.start(f"soak-{backend}", url, 30.0)
        port = service.port

        stop, samples = threading.Event(), []
        watcher = threading.Thread(target=sampler, args=(service, pg, stop, samples))
        watcher.start()
        # Misses and 401s ask for ids far above any seeded one.
        firsts = {"hit": 1, "miss": 10**12, "noauth": 2 * 10**12}
        ends = {"hit": rows + 1, "miss": 2 * 10**12, "noauth": 3 * 10**12}
        with ThreadPoolExecutor(len(STREAMS)) as pool:
            runs = {
                mode: pool.submit(run_wrk, port, mode, conns, firsts[mode], ends[mode],
                                  seconds, token, work / f"soak-{backend}-{mode}.txt")
                for mode, conns in STREAMS.items()
            }
            results = {mode: future.result() for mode, future in runs.items()}
        ended = time.monotonic()
        while pending(plantstore, url) > 0 and time.monotonic() - ended < DRAIN_S:
            time.sleep(0.2)
        drained_s = time.monotonic() - ended
        stop.set()
        watcher.join()
        rss_peak = service.peak_rss_mib()
        service.stop()
        PROCS.stop(receiver)
        trim_log(service.log)
        committed = commit_times(pg if pg is not None else sq, 1, rows + 1)
    finally:
        if pg is not None:
            pg.drop()
    received: dict[str, float] = {}
    for line in (rdir / "access.log").read_text().splitlines():
        at, hook = (line.split(" ") + [""])[:2]
        if hook in committed and hook not in received:
            received[hook] = float(at)
    lags = sorted(received[h] - committed[h] for h in received)
    lag_p99 = lags[min(len(lags) - 1, int(len(lags) * 0.99))] if lags else None

    ok = True
    print(f"\n## {backend}: {seconds} s, 64 connections (hits {STREAMS['hit']}, "
          f"misses {STREAMS['miss']}, 401s {STREAMS['noauth']})")
    for mode, data in results.items():
        odd = unexpected(data, EXPECT[mode])
        ok &= not odd
        print(f"- {mode}: {data['requests']:,} requests, {data['rps']} req/s, "
              f"unexpected: {fmt_unexpected(odd)}")
    warm = max(30.0, seconds / 10)
    after = [s for s in samples if s[0] >= warm]
    if not after:
        print("- too short to judge memory: no sample after the warm-up")
        return False
    rss_start, rss_end = after[0][1], after[-1][1]
    growth = (rss_end - rss_start) / rss_start * 100 if rss_start else 0.0
    fds = spread([s[2] for s in after])
    conns = spread([s[3] for s in after])
    print(f"- RSS at the first sample {samples[0][1]:.1f} MiB, after warm-up {rss_start:.1f} MiB, "
          f"peak {rss_peak:.1f} MiB, at the end {rss_end:.1f} MiB: {growth:+.1f} % after "
          f"warm-up (limit +10 %)")
    print(f"- deletion events: {len(received):,} of {len(committed):,} received; lag p99 "
          f"{lag_p99:.3f} s (limit {LAG_P99_LIMIT_S} s), max {lags[-1]:.3f} s; pending drained "
          f"{drained_s:.1f} s after the load" if lags else "- deletion events: none received")
    ok &= bool(lags) and len(received) == len(committed) and lag_p99 <= LAG_P99_LIMIT_S
    print(f"- open fds after warm-up: {min(s[2] for s in after)}-{max(s[2] for s in after)}, "
          f"first {after[0][2]}, last {after[-1][2]} "
          f"(spread {fds}, limit {FLAT + WEBHOOK_CONNECTIONS}: {FLAT} and the endpoint's "
          f"{WEBHOOK_CONNECTIONS} connections at most)")
    if pg is not None:
        print(f"- PostgreSQL connections after warm-up: spread {conns} (limit {FLAT}), "
              f"max {max(s[3] for s in after)}")
    ok &= growth < 10.0 and fds <= FLAT + WEBHOOK_CONNECTIONS and conns <= FLAT
    print(f"- {'OK' if ok else 'FAIL'}")
    return ok


def pending(plantstore: Build, url: str) -> int:
    listed = json.loads(plantstore.cli(url, "webhooks", "list", "--json"))
    return sum(e["pending"] for e in listed)


def main() -> int:
    seconds = env_int("SOAK_SECONDS", 600)
    work = ROOT / "bench" / "out" / "soak"
    work.mkdir(parents=True, exist_ok=True)
    binary = Path(os.environ.get("BENCH_PLANTSTORE_BIN", ROOT / "target/release/plantstore"))
    pg_admin = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    plantstore = Build(binary, work)
    try:
        results = [soak(backend, plantstore, seconds, work, pg_admin)
                   for backend in ("sqlite", "postgres")]
    finally:
        PROCS.stop_all()
    print("\nsoak:", "all OK" if all(results) else "FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

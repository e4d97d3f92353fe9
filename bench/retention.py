#!/usr/bin/env python3
"""Retention under load: deletes at 64 connections while the service prunes the deletion log
to PLANTSTORE_DELETION_RETENTION, beside the same runs with retention off.

Start it through `bench/retention` (which builds what is missing). On each backend it makes a
log of old entries (deletes through the service, then their `deleted_at` set 100 days back),
then runs PAIRS pairs of SECONDS-long hit runs at 64 connections, each on a fresh service
process: one with retention off, one with `90d`, in alternating order. Before each run every
entry from the runs before is made 100 days old, so an `on` run has hundreds of thousands of
entries to prune, more than it prunes in the run. It prints each run's hits/s, p99 and the old
entries before and after, and the median ratios on/off. The target (issue 43): hits/s at
least 0.9 of `off`, p99 at most 1.1 of it, and every old entry gone by the end of the last
`on` run's drain. Never run by CI.
"""

from __future__ import annotations

import os
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.dont_write_bytecode = True
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from toolkit.processes import PROCS  # noqa: E402
from harness.builds import Build  # noqa: E402
from harness.databases import Postgres, Sqlite  # noqa: E402
from harness.load import run_wrk, unexpected  # noqa: E402

CONNS = 64
SECONDS = int(os.environ.get("RETENTION_SECONDS", "30"))
PAIRS = int(os.environ.get("RETENTION_PAIRS", "3"))
# Ids each run may use: more than 64 connections delete in SECONDS on these cores.
PER_RUN = 1_000_000
OLD_SECONDS = 15
TARGET_HITS, TARGET_P99 = 0.9, 1.1
# The drain after the last pair: the backlog is millions of entries by then, and a count
# reads the whole log, so it is polled every few seconds.
DRAIN_S, DRAIN_POLL_S = 1800, 5
# Which backends to run, in this order (for example `postgres` alone while profiling it).
BACKENDS = os.environ.get("RETENTION_BACKENDS", "sqlite,postgres").split(",")


def write_sqlite(db, sql: str, params: tuple = ()) -> None:
    """One statement on the SQLite file, committed."""
    con = sqlite3.connect(db.path, timeout=60)
    try:
        con.execute(sql, params)
        con.commit()
    finally:
        con.close()


def make_old(db, backend: str) -> None:
    """Every entry younger than a day (the runs' own) made 100 days old."""
    if backend == "postgres":
        db.psql("UPDATE plantstore_deletions SET deleted_at = now() - interval '100 days' "
                "WHERE deleted_at > now() - interval '1 day'")
    else:
        cutoff = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 86400))
        old = time.strftime("%Y-%m-%dT%H:%M:%S.000000+00:00",
                            time.gmtime(time.time() - 100 * 86400))
        write_sqlite(db, "UPDATE plantstore_deletions SET deleted_at = ? WHERE deleted_at > ?",
                     (old, cutoff))


def old_entries(db) -> int:
    # Stored as RFC 3339 text on SQLite, so the cutoff is compared as text there.
    cutoff = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() - 90 * 86400))
    return db.scalar(f"SELECT count(*) FROM plantstore_deletions WHERE deleted_at < '{cutoff}'")


def one_run(plantstore: Build, db, url: str, backend: str, work: Path, token: str, lo: int,
            retention: bool, tag: str) -> dict:
    make_old(db, backend)
    db.settle(vacuum=False)
    before = old_entries(db)
    settings = {"PLANTSTORE_DELETION_RETENTION": "90d"} if retention else {}
    service = plantstore.start(f"service-{tag}", url, 60, **settings)
    data = run_wrk(service.port, "hit", CONNS, lo, lo + PER_RUN, SECONDS, token,
                   work / f"wrk-{tag}.out")
    after = old_entries(db)
    service.stop()
    odd = unexpected(data, "204")
    print(f"  {tag}: retention {'90d' if retention else 'off'}: {data['rps']:,.0f} hits/s, "
          f"p99 {data['p99_ms']:.2f} ms; old entries {before:,} before, {after:,} after "
          f"({before - after:,} pruned in the run); unexpected: {odd or 'none'}", flush=True)
    return {"rps": float(data["rps"]), "p99": float(data["p99_ms"]), "before": before,
            "after": after, "odd": odd}


def backend_runs(backend: str, plantstore: Build, work: Path, pg_admin: str) -> bool:
    if backend == "postgres":
        db = Postgres(pg_admin, "plantstore_retention_bench")
        db.recreate()
    else:
        db = Sqlite(work / "retention.db")
        db.remove()
    url = db.url
    try:
        plants = (2 * PAIRS + 1) * PER_RUN
        plantstore.cli(url, "migrate")
        plantstore.cli(url, "seed", "--count", str(plants))
        token = plantstore.cli(url, "token", "create", "--name", "bench").strip().splitlines()[-1]
        print(f"\n## {backend}: {PAIRS} pairs of {SECONDS} s at {CONNS} connections", flush=True)
        # The first log: one run's worth of deletes, made old by the first run's start.
        service = plantstore.start(f"service-{backend}-fill", url, 60)
        run_wrk(service.port, "hit", CONNS, 1, PER_RUN, OLD_SECONDS, token, work / "wrk-fill.out")
        service.stop()
        ratios_rps, ratios_p99, odd = [], [], []
        lo = PER_RUN + 1
        for pair in range(1, PAIRS + 1):
            order = (False, True) if pair % 2 else (True, False)
            runs = {}
            for retention in order:
                tag = f"{backend}-{pair}-{'on' if retention else 'off'}"
                runs[retention] = one_run(plantstore, db, url, backend, work, token, lo,
                                          retention, tag)
                lo += PER_RUN
            ratios_rps.append(runs[True]["rps"] / runs[False]["rps"])
            ratios_p99.append(runs[True]["p99"] / runs[False]["p99"])
            odd += [run["odd"] for run in runs.values() if run["odd"]]
            print(f"  pair {pair}: on/off hits {ratios_rps[-1]:.3f}, p99 {ratios_p99[-1]:.3f}",
                  flush=True)
        # The last `on` run's pruning, left to finish with no load: every old entry goes.
        service = plantstore.start(f"service-{backend}-drain", url, 60,
                                   PLANTSTORE_DELETION_RETENTION="90d")
        backlog, started = old_entries(db), time.monotonic()
        left = backlog
        while left > 0 and time.monotonic() - started < DRAIN_S:
            time.sleep(DRAIN_POLL_S)
            left = old_entries(db)
        drained_s = time.monotonic() - started
        service.stop()
        rps, p99 = statistics.median(ratios_rps), statistics.median(ratios_p99)
        ok = rps >= TARGET_HITS and p99 <= TARGET_P99 and left == 0 and not odd
        print(f"- median on/off: hits/s {rps:.3f} (target >= {TARGET_HITS}), p99 {p99:.3f} "
              f"(target <= {TARGET_P99}); the drain with no load: {backlog - left:,} of "
              f"{backlog:,} old entries pruned in {drained_s:.0f} s "
              f"({(backlog - left) / drained_s:,.0f} a second), {left:,} left (target 0): "
              f"{'OK' if ok else 'MISSED'}", flush=True)
        return ok
    finally:
        if backend == "postgres":
            db.drop()


def main() -> int:
    work = ROOT / "bench" / "out" / "retention"
    work.mkdir(parents=True, exist_ok=True)
    binary = Path(os.environ.get("BENCH_PLANTSTORE_BIN", ROOT / "target/release/plantstore"))
    pg_admin = os.environ.get("BENCH_PG_ADMIN_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    if not BACKENDS or set(BACKENDS) - {"sqlite", "postgres"}:
        print(f"RETENTION_BACKENDS={','.join(BACKENDS)}: name sqlite, postgres or both",
              file=sys.stderr)
        return 2
    plantstore = Build(binary, work)
    try:
        results = [backend_runs(b, plantstore, work, pg_admin) for b in BACKENDS]
    finally:
        PROCS.stop_all()
    print("\nretention under load:", "targets met" if all(results) else "a target MISSED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())

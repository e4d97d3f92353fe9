"""One run from start to end: settings, databases, each measurement in turn, the report (the id
plan is plan.py's)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from toolkit.processes import PROCS

from .builds import Build
from .chart import chart_svg
from .checks import describe_blocks_check, describe_hits_check, verify_hits
from .common import (BACKEND_NAME, BACKENDS, BENCH, CONNS, MISS_FIRST, NOAUTH_FIRST,
                     READYZ_STARTS, ROOT, WORKLOADS, Interrupted, env_int, fmt, fmt_rate, log,
                     on_signal)
from .databases import Postgres, Sqlite, count_range, run_pgbench, run_sqlite_raw
from .guard import (builds_table, guard_runs, guard_table, guard_targets, profile_builds,
                    profile_targets)
from .load import fmt_unexpected, nginx_anchor, service_under_wrk
from .machine import machine_info, measure_fsync
from .plan import Plan, plan_ids
from .report import markdown_table, result_rows, results_markdown, targets, targets_table
from .standby import SyncPair, standby_table, standby_targets
from .webhooks import (PAIRS, RECEIVERS, pick_median_pair, webhook_run, webhook_table,
                       webhook_targets, webhook_targets_table)

@dataclass
class Settings:
    """What the environment (BENCH_*) asks of this run."""

    seconds: int
    out_dir: Path
    plantstore: Path
    sqlite_raw_bin: Path
    pg_admin: str
    pg_db: str
    keep: bool
    # `bench/run --guard REV`: the service built from REV, measured beside this checkout's.
    baseline: Path | None
    # `bench/run --profiles`: where the two profiles' builds and builds.tsv are.
    profiles: Path | None
    # `bench/run --standby`: where the builds with and without the barrier are.
    standby: Path | None


def settings() -> Settings:
    s = Settings(
        seconds=env_int("BENCH_SECONDS", 10),
        out_dir=Path(os.environ.get("BENCH_OUT") or BENCH / "out").resolve(),
        plantstore=Path(os.environ.get("BENCH_PLANTSTORE_BIN")
                        or ROOT / "target/release/plantstore"),
        sqlite_raw_bin=Path(os.environ.get("BENCH_SQLITE_RAW_BIN")
                            or ROOT / "target/release/sqlite-raw"),
        pg_admin=(os.environ.get("BENCH_PG_ADMIN_URL")
                  or "postgres://postgres@127.0.0.1:5432/postgres"),
        pg_db=os.environ.get("BENCH_PG_DB") or "plantstore_bench",
        keep=os.environ.get("BENCH_KEEP") == "1",
        baseline=(Path(os.environ["BENCH_BASELINE_BIN"])
                  if os.environ.get("BENCH_BASELINE_BIN") else None),
        profiles=(Path(os.environ["BENCH_PROFILES"])
                  if os.environ.get("BENCH_PROFILES") else None),
        standby=(Path(os.environ["BENCH_STANDBY"])
                 if os.environ.get("BENCH_STANDBY") else None),
    )
    if s.standby:
        # The build without the barrier is the baseline, this checkout's is measured.
        s.baseline = s.standby / "plantstore-no-barrier"
        s.plantstore = s.standby / "plantstore"
    if s.profiles:
        if not (s.profiles / "builds.tsv").is_file():
            sys.exit(f"bench: {s.profiles}/builds.tsv is missing; run bench/run --profiles "
                     "without --no-build first")
        # The release profile's build is the baseline, the lighter one's is measured.
        s.baseline = s.profiles / "fat/release/plantstore"
        s.plantstore = s.profiles / "thin/release/plantstore"
    # Only the full run measures the raw SQLite loop.
    raw = [] if s.baseline else [s.sqlite_raw_bin]
    for b in (s.plantstore, *raw, *([s.baseline] if s.baseline else [])):
        if not os.access(b, os.X_OK):
            sys.exit(f"bench: {b} is missing; build it (bench/run without --no-build)")
    for tool in ("wrk", "psql"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is not installed")
    return s


def make_work_dir(out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / "work"
    marker = work / ".bench-work"
    if work.exists() and not marker.exists():
        sys.exit(f"bench: {work} exists and was not made by bench/run; choose another BENCH_OUT")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    marker.write_text("made by bench/run; emptied at the start of every run\n")
    return work


class Bench:
    """One run's state: settings, plan, the service and databases, all it measured (R), failures."""

    def __init__(self, s: Settings, plan: Plan, work: Path):
        self.s = s
        self.plan = plan
        self.work = work
        # The build measured: this checkout's (--profiles: its lighter profile's).
        self.checkout = Build(s.plantstore, work)
        self.pg = Postgres(s.pg_admin, s.pg_db)
        self.sq = Sqlite(work / "bench.db")
        self.R: dict = {"config": {"seconds": s.seconds, "ids_per_run": plan.span,
                                   "rows": plan.rows, "connections": list(CONNS),
                                   "plantstore": str(s.plantstore),
                                   "sqlite_raw": str(s.sqlite_raw_bin), "postgres_db": s.pg_db},
                        "service": {b: {w: {} for w in WORKLOADS} for b in BACKENDS},
                        "anchors": {"pgbench": {}, "nginx": {}}}
        self.failures: list[str] = []
        self.tokens: dict[str, str] = {}
        self.started_at = time.time()
        # `--standby`: the primary and its synchronous standby, stopped at the end.
        self.pair: SyncPair | None = None

    def note_check(self, label: str, check: dict, describe) -> None:
        log(f"  check: {describe(check)}")
        if not check["ok"]:
            self.failures.append(f"{label}: " + "; ".join(check["problems"]))


def machine_and_disk(b: Bench) -> None:
    """Before anything else touches the disk."""
    b.R["machine"] = m = machine_info()
    log(f"machine: {m['nproc']} cores, {m['cpu_model']}, kernel {m['kernel']}, "
        f"{fmt(m['mem_gib'], 1)} GiB, {m['date']}, commit {m['commit']}")
    b.R["fsync"] = f = measure_fsync(b.work)
    log(f"disk: {f['fsyncs_per_s']:,.0f} fsyncs/s, {f['ms_per_fsync']:.3f} ms per fsync "
        f"(p50 {f['p50_ms']:.3f}, p99 {f['p99_ms']:.3f} ms; 4 KiB pwrite+fsync for "
        f"{f['seconds']:.1f} s in {f['directory']}, {f['filesystem']}, beside the SQLite database)")
    rows = b.plan.rows
    log(f"runs: {b.s.seconds} s each; ids per deleting run {b.plan.span:,}; rows seeded: SQLite "
        f"{rows['sqlite']:,}, PostgreSQL {rows['postgres']:,}")
    log("never compare these figures with another run's: everything below is from this run")


def prepare_databases(b: Bench) -> None:
    log("\n== preparing databases")
    b.sq.remove()
    b.pg.recreate()
    b.R["machine"]["postgres"] = b.pg.version()
    ddir = b.pg.data_directory()
    if ddir:
        same = os.path.exists(ddir) and os.stat(ddir).st_dev == os.stat(b.work).st_dev
        b.R["machine"]["postgres_data_directory_same_filesystem"] = same
        if not same:
            log(f"note: PostgreSQL's data directory {ddir} is not on the SQLite database's "
                "filesystem, so the fsync rate above is the SQLite disk's only")
    for backend, url, db in (("sqlite", b.sq.url, b.sq), ("postgres", b.pg.url, b.pg)):
        b.tokens[backend] = seed(b, backend, url, db)


def seed(b: Bench, backend: str, url: str, db) -> str:
    """Migrates and seeds one database; returns the token the wrk runs send."""
    rows = b.plan.rows[backend]
    t0 = time.perf_counter()
    b.checkout.cli(url, "migrate")
    b.checkout.cli(url, "seed", "--count", str(rows))
    seeded = time.perf_counter() - t0
    n = db.scalar(f"SELECT count(*) FROM plants WHERE id >= 1 AND id <= {rows}")
    if n != rows:
        raise RuntimeError(f"{backend}: seeded {n} rows, wanted {rows}")
    out = b.checkout.cli(url, "token", "create", "--name", "bench").strip().splitlines()
    if not out or not out[-1].strip():
        raise RuntimeError(f"{backend}: token create printed no token")
    log(f"{BACKEND_NAME[backend]}: migrated, {n:,} plants seeded in {seeded:.1f} s, token created")
    return out[-1].strip()


def service_runs(b: Bench, backend: str, url: str, db) -> None:
    for workload in WORKLOADS:
        for conns in CONNS:
            service_run(b, backend, url, db, workload, conns)


def service_run(b: Bench, backend: str, url: str, db, workload: str, conns: int,
                beside: int | None = None) -> None:
    """A fresh service process (so its peak RSS is this run's) under wrk; hits are then checked.
    `beside`: the pair (0, 1, ...) whose webhook run this hit run is just before, kept apart
    as what that run is compared with."""
    db.settle(vacuum=workload == "hits")
    if beside is not None:
        lo, hi = b.plan.beside[backend][beside]
        before = count_range(db, lo, hi)
    elif workload == "hits":
        lo, hi = b.plan.hits[backend][conns]
        before = count_range(db, lo, hi)
    elif workload == "misses":
        lo, hi = MISS_FIRST, 0
    else:
        lo, hi = NOAUTH_FIRST, 0
    tag = "" if beside is None else f"-before-webhook-{beside + 1}"
    d = service_under_wrk(b.checkout, url, b.work, workload, conns, lo, hi, b.s.seconds,
                          b.tokens[backend], f"{backend}-{workload}-{conns}{tag}", b.s.keep)
    code = d["exit_code"]
    if beside is not None:
        b.R.setdefault("beside", {})[backend] = d
    else:
        b.R["service"][backend][workload][str(conns)] = d
    name = (f"{workload:<6}" if beside is None
            else f"hits (just before webhook run {beside + 1} of {PAIRS})")
    line = (f"{backend:<8} {name} c={conns:<3} {fmt_rate(d['rps']):>9} req/s  "
            f"p50 {fmt(d['p50_ms'], 3)} ms  p99 {fmt(d['p99_ms'], 3)} ms  "
            f"peak RSS {fmt(d['peak_rss_mib'], 1)} MiB  "
            f"unexpected: {fmt_unexpected(d['unexpected'])}")
    if code != 0:
        ended = f"exited {code}" if code is not None else "still running 30 s"
        line += f"  ({ended} after SIGTERM; see {d['service_log']})"
    log(line)
    if workload == "hits":
        d["check"] = v = verify_hits(db, lo, hi, before, d)
        b.note_check(f"{backend} hits c={conns}", v, describe_hits_check)


def measure_sqlite(b: Bench) -> None:
    """The raw anchor, the service, then start-up time on the database the runs left."""
    log("\n== SQLite")
    lo, hi = b.plan.raw_sqlite
    b.sq.settle(vacuum=False)
    a = run_sqlite_raw(b.s.sqlite_raw_bin, b.sq, lo, hi, b.s.seconds, b.work)
    b.R["anchors"]["sqlite-raw"] = a
    log(f"sqlite-raw c=1   {fmt_rate(a['rps']):>9} del/s  p50 {fmt(a['p50_ms'], 3)} ms  "
        f"p99 {fmt(a['p99_ms'], 3)} ms")
    b.note_check("sqlite-raw", a["check"], describe_blocks_check)
    service_runs(b, "sqlite", b.sq.url, b.sq)
    webhook_pairs(b, "sqlite", b.sq.url, b.sq)
    measure_startup(b)


def webhook_pairs(b: Bench, backend: str, url: str, db, baseline: Build | None = None) -> None:
    """PAIRS times a hit run at 64 connections, then one with each destination (RECEIVERS);
    for each, the pair whose ratio is the median is the one reported. One pair's ratio swung
    from 0.72 to 1.07 with the same build within minutes (the disk's and the neighbours' pace
    drift), so one pair alone can neither show nor rule out a change of a few percent. With
    `baseline` (`--guard`), each run with a destination is made with REV's build just before,
    so that what a change costs delivery is a ratio within one run too."""
    for pair in range(PAIRS):
        service_run(b, backend, url, db, "hits", 64, beside=pair)
        for scheme in RECEIVERS:
            if baseline is None:
                webhook_run(b, backend, url, db, pair, scheme)
                continue
            builds = b.R["guard"][backend].setdefault(f"hits+{scheme}", {})
            ids = b.plan.hooked_before[backend][scheme][pair]
            builds.setdefault("before", []).append(
                webhook_run(b, backend, url, db, pair, scheme, baseline, ids))
            builds.setdefault("after", []).append(webhook_run(b, backend, url, db, pair, scheme))
    pick_median_pair(b.R, backend)


def measure_startup(b: Bench) -> None:
    """SQLite service start to the first 200 from /readyz, READYZ_STARTS times."""
    b.sq.settle(vacuum=False)
    starts = []
    for i in range(READYZ_STARTS):
        t0 = time.perf_counter()
        service = b.checkout.start(f"service-sqlite-start-{i + 1}", b.sq.url, 60)
        starts.append((time.perf_counter() - t0) * 1000)
        service.stop()
    b.R["readyz"] = {"ms": starts, "median_ms": statistics.median(starts)}
    log(f"start to /readyz 200 (SQLite, {READYZ_STARTS} starts): median "
        f"{statistics.median(starts):.1f} ms ({', '.join(f'{x:.1f}' for x in starts)})")


def measure_postgres(b: Bench) -> None:
    """pgbench at each client count, then the service."""
    log("\n== PostgreSQL")
    for conns in CONNS:
        lo, hi = b.plan.pgbench[conns]
        b.pg.settle(vacuum=True)
        a = run_pgbench(b.pg, conns, lo, hi, b.s.seconds, b.work)
        b.R["anchors"]["pgbench"][str(conns)] = a
        log(f"pgbench    c={conns:<3} {fmt_rate(a['rps']):>9} tps    p50 {fmt(a['p50_ms'], 3)} ms  "
            f"p99 {fmt(a['p99_ms'], 3)} ms  failed: {a['failed']}")
        b.note_check(f"pgbench c={conns}", a["check"], describe_blocks_check)
    service_runs(b, "postgres", b.pg.url, b.pg)
    webhook_pairs(b, "postgres", b.pg.url, b.pg)


def write_report(b: Bench) -> int:
    """Prints the tables, writes results.md, results.json and chart.svg; returns the exit code."""
    R, out_dir = b.R, b.s.out_dir
    R["elapsed_s"] = time.time() - b.started_at
    R["targets"] = ts = targets(R)
    R["failures"] = b.failures
    table = markdown_table(result_rows(R))
    ttable = targets_table(ts)
    wtable = webhook_table(R)
    R["webhook_targets"] = wts = webhook_targets(R)
    wttable = webhook_targets_table(wts)
    md = results_markdown(R, table, ttable) + (
        "\n## Deletion events\n\nHits at 64 connections with one webhook endpoint (nginx "
        "`return 204`, over http and over https with HTTP/2) beside the same without one; CPU "
        "per delete: the service's own, until every event was delivered; lag: a delete's "
        "commit to its receipt.\n\n" + wtable + "\n\n" + wttable + "\n")
    log("\n" + table + "\n")
    log(wtable + "\n")
    log(wttable + "\n")
    log(ttable + "\n")
    (out_dir / "results.md").write_text(md)
    (out_dir / "results.json").write_text(json.dumps(R, indent=2, default=str) + "\n")
    svg = chart_svg(R)
    (out_dir / "chart.svg").write_text(svg)
    if out_dir != BENCH:
        (BENCH / "chart.svg").write_text(svg)
    log(f"wrote {out_dir}/results.md, results.json, chart.svg; copied chart.svg to "
        f"{BENCH / 'chart.svg'} ({R['elapsed_s'] / 60:.1f} min)")
    if b.failures:
        log("\nFAIL: " + "\n      ".join(b.failures))
        return 1
    log("all checks OK")
    return 0


def measure_beside(b: Bench) -> int:
    """`--guard REV`: REV's build (before) and this checkout's (after) alternated on both
    backends, without a destination and then with one of each kind. `--profiles`: the
    release profile's build (before) and the lighter one's (after) alternated the same way,
    beside each build's time and size. Only their targets are reported."""
    machine_and_disk(b)
    prepare_databases(b)
    # The databases are migrated by this checkout's build; an older one does not know its
    # newer migrations and would refuse to start, so it only checks the schema (which a
    # newer migration extends, never takes from).
    baseline = Build(b.s.baseline, b.work, {"PLANTSTORE_MIGRATE": "false"})
    for backend, url, db in (("sqlite", b.sq.url, b.sq), ("postgres", b.pg.url, b.pg)):
        log(f"\n== {BACKEND_NAME[backend]}: before ({b.s.baseline}) and after "
            f"({b.s.plantstore}), alternated")
        guard_runs(b, baseline, backend, url, db)
        if not b.s.profiles:
            webhook_pairs(b, backend, url, db, baseline)
    R = b.R
    if b.s.profiles:
        R["builds"] = builds = profile_builds(b.s.profiles / "builds.tsv")
        R["profile_targets"] = ts = profile_targets(R)
        return write_tables(b, "--profiles: lto=fat, codegen-units=1 (before) beside "
                            "lto=thin, codegen-units=16 (after)",
                            (builds_table(builds), guard_table(R), webhook_targets_table(ts)))
    R["guard_targets"] = ts = guard_targets(R) + webhook_targets(R)
    return write_tables(b, f"--guard: {b.s.baseline} (before) beside this checkout (after)",
                        (guard_table(R), webhook_table(R), webhook_targets_table(ts)))


def write_tables(b: Bench, title: str, tables: tuple[str, ...]) -> int:
    """The report of a `--guard` or `--profiles` run: its tables, logged and written to
    results.md, everything measured to results.json; 1 when a check failed."""
    R = b.R
    R["elapsed_s"] = time.time() - b.started_at
    R["failures"] = b.failures
    text = "\n\n".join(tables)
    log("\n" + text + "\n")
    (b.s.out_dir / "results.md").write_text(
        f"# bench/run {title}\n\n{R['machine']['date']}, commit {R['machine']['commit']}\n\n"
        f"{text}\n")
    (b.s.out_dir / "results.json").write_text(json.dumps(R, indent=2, default=str) + "\n")
    log(f"wrote {b.s.out_dir}/results.md and results.json ({R['elapsed_s'] / 60:.1f} min)")
    if b.failures:
        log("\nFAIL: " + "\n      ".join(b.failures))
        return 1
    log("all checks OK")
    return 0


def measure_standby(b: Bench) -> int:
    """`--standby`: on a primary with a synchronous standby of the run's own, one replication
    round trip, then PAIRS times: hits without an endpoint, then with one webhook endpoint
    on the build without the barrier, then on this checkout's."""
    machine_and_disk(b)
    log("\n== a primary and a synchronous standby")
    b.pair = SyncPair(b.work)
    b.pair.start()
    b.pg = Postgres(b.pair.admin_url, b.s.pg_db)
    b.pg.recreate()
    b.tokens["postgres"] = seed(b, "postgres", b.pg.url, b.pg)
    rt = b.pair.round_trip_ms(b.pg.url, 5, b.work)
    b.R["standby"] = {"round_trip": rt, "pairs": []}
    log(f"one replication round trip: {rt['round_trip_ms']:.3f} ms (a WAL-writing commit: "
        f"{rt['sync_ms']:.3f} ms with the standby, {rt['local_ms']:.3f} ms local)")
    without_barrier = Build(b.s.baseline, b.work)
    for pair in range(PAIRS):
        service_run(b, "postgres", b.pg.url, b.pg, "hits", 64, beside=pair)
        runs = {}
        for i, (build, plantstore) in enumerate((("without", without_barrier),
                                                 ("with", b.checkout))):
            runs[build] = webhook_run(b, "postgres", b.pg.url, b.pg, pair, "http", plantstore,
                                      b.plan.standby[2 * pair + i])
        b.R["standby"]["pairs"].append(runs)
    b.R["standby_targets"] = ts = standby_targets(b.R)
    return write_tables(b, "--standby: deletion events waiting for a synchronous standby",
                        (standby_table(b.R), webhook_targets_table(ts)))


def measure(b: Bench) -> int:
    if b.s.standby:
        return measure_standby(b)
    if b.s.baseline:
        return measure_beside(b)
    machine_and_disk(b)
    prepare_databases(b)
    log("\n== nginx (HTTP ceiling)")
    b.R["anchors"]["nginx"] = nginx_anchor(b.work, b.s.seconds)
    measure_sqlite(b)
    measure_postgres(b)
    return write_report(b)


def clean_up(b: Bench) -> None:
    """Stops every process the run started, drops its database, deletes the SQLite file."""
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, signal.SIG_IGN)
    PROCS.stop_all()
    try:
        b.pg.drop()
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        log(f"bench: could not drop database {b.s.pg_db}: {e}")
    if b.pair:
        b.pair.stop()
    if not b.s.keep:
        b.sq.remove()


def main() -> int:
    s = settings()
    work = make_work_dir(s.out_dir)
    b = Bench(s, plan_ids(s.seconds, s.baseline is not None), work)
    # Ctrl-C raises KeyboardInterrupt even when started with SIGINT ignored (e.g. from `&`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        return measure(b)
    except (KeyboardInterrupt, Interrupted) as e:
        log(f"\nbench: interrupted ({str(e) or 'SIGINT'}); cleaning up")
        return 130
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        log(f"\nbench: error: {e}\n(logs in {work})")
        return 2
    finally:
        clean_up(b)

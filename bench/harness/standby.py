"""`bench/run --standby`: what waiting for a synchronous standby before deletion events go out
costs. A PostgreSQL primary and a synchronous standby of the run's own (initdb and
pg_basebackup from the machine's programs, on free ports, with fsync on), one replication
round trip measured on them, then PAIRS times in turn the build without the barrier (the
`negative-control` feature) and this checkout's: hits at 64 connections with one webhook
endpoint (nginx `return 204`), the lag from each delete's commit to its receipt, and how soon
delivery drains after the load."""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import time
from pathlib import Path

from toolkit.common import free_port
from toolkit.processes import run

from .common import fmt, fmt_rate, log
from .databases import pgbench_binary

STANDBY_NAME = "bench_standby"
# The barrier's targets beside the build without it: hits within 10 %, the lag at most one
# replication round trip more, and pending drained within 2 s of the load.
HITS_WITHIN = 0.10
DRAIN_TARGET_S = 2.0
BUILDS = (("without", "without the barrier"), ("with", "with the barrier"))


def _as_postgres(cmd: list, **kw) -> subprocess.CompletedProcess:
    """PostgreSQL refuses to run as root; its files are then the `postgres` user's."""
    if os.geteuid() == 0:
        cmd = ["runuser", "-u", "postgres", "--", *cmd]
    return run([str(c) for c in cmd], timeout=600, **kw)


def _bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name))
    if not found:
        raise RuntimeError("no /usr/lib/postgresql/*/bin/initdb: install postgresql")
    return found[-1].parent


class SyncPair:
    """A primary whose commits wait for one synchronous standby, both in `work`."""

    def __init__(self, work: Path):
        self.bin = _bin_dir()
        self.dir = work / "standby-pair"
        shutil.rmtree(self.dir, ignore_errors=True)
        self.dir.mkdir()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self.primary = (self.dir / "primary", free_port())
        self.standby = (self.dir / "standby", free_port())
        self.started: list[Path] = []

    @property
    def admin_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.primary[1]}/postgres"

    def start(self) -> None:
        data, port = self.primary
        _as_postgres([self.bin / "initdb", "-N", "-A", "trust", "-U", "postgres", "-D", data])
        self._pg_ctl_start(data, port, f"-c synchronous_standby_names={STANDBY_NAME}")
        sdata, sport = self.standby
        _as_postgres([self.bin / "pg_basebackup", "-h", "127.0.0.1", "-p", port, "-U",
                      "postgres", "-D", sdata, "-X", "stream"])
        with open(sdata / "postgresql.auto.conf", "a") as conf:
            conf.write(f"\nprimary_conninfo = 'host=127.0.0.1 port={port} user=postgres "
                       f"application_name={STANDBY_NAME}'\n")
        (sdata / "standby.signal").touch()
        self._pg_ctl_start(sdata, sport, "")
        for _ in range(300):
            state = run(["psql", self.admin_url, "-qAtX", "-c",
                         "SELECT sync_state FROM pg_stat_replication "
                         f"WHERE application_name = '{STANDBY_NAME}'"],
                        timeout=30, check=False).stdout.strip()
            if state == "sync":
                return
            time.sleep(0.1)
        raise RuntimeError("the standby never replicated synchronously")

    def _pg_ctl_start(self, data: Path, port: int, settings: str) -> None:
        options = (f"-p {port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                   f"-c max_connections=200 {settings}")
        _as_postgres([self.bin / "pg_ctl", "start", "-w", "-D", data, "-l",
                      self.dir / f"{data.name}.log", "-o", options])
        self.started.append(data)

    def stop(self) -> None:
        for data in reversed(self.started):
            _as_postgres([self.bin / "pg_ctl", "stop", "-w", "-m", "fast", "-D", data],
                         check=False)
        self.started.clear()

    def round_trip_ms(self, url: str, seconds: int, work: Path) -> dict:
        """A commit that writes WAL, one client, with the standby and with
        `synchronous_commit = local`: the difference of their mean latencies is what one
        wait for the standby adds."""
        script = work / "pgbench-barrier.sql"
        script.write_text("SELECT pg_logical_emit_message(true, 'bench', '');\n")
        means = {}
        for level in ("on", "local"):
            env = dict(os.environ, PGOPTIONS=f"-c synchronous_commit={level}")
            out = run([pgbench_binary(), "-n", "-f", str(script), "-c", "1", "-T",
                       str(seconds), url], timeout=seconds + 120, env=env).stdout
            found = re.search(r"latency average = ([\d.]+) ms", out)
            if not found:
                raise RuntimeError(f"could not read pgbench's output:\n{out}")
            means[level] = float(found.group(1))
        return {"sync_ms": means["on"], "local_ms": means["local"],
                "round_trip_ms": means["on"] - means["local"]}


def standby_table(R: dict) -> str:
    rows = ["| pair | build | hits c=64, req/s | lag p50 | lag p99 | drained after wrk | "
            "received |", "|--:|---|--:|--:|--:|--:|--:|"]
    for pair, runs in enumerate(R["standby"]["pairs"], 1):
        for build, label in BUILDS:
            d = runs[build]
            rows.append(f"| {pair} | {label} | {fmt_rate(d['rps'])} | "
                        f"{fmt(d['lag_p50_s'] * 1000, 1)} ms | {fmt(d['lag_p99_s'] * 1000, 1)} ms | "
                        f"{d['drain_s']:.2f} s | {d['received']:,} of {d['events']:,} |")
    rt = R["standby"]["round_trip"]
    return ("\n".join(rows) + f"\n\nOne replication round trip: {rt['round_trip_ms']:.2f} ms "
            f"(a WAL-writing commit, one client: {rt['sync_ms']:.2f} ms waiting for the standby, "
            f"{rt['local_ms']:.2f} ms with synchronous_commit = local).")


def standby_targets(R: dict) -> list[dict]:
    """On the median of the pairs: hits with / without within 10 %, lag p50 and p99 at most
    one round trip more, and the barrier build's drain within 2 s."""
    pairs = R["standby"]["pairs"]
    rt = R["standby"]["round_trip"]["round_trip_ms"] / 1000

    def median(f):
        return statistics.median(f(p) for p in pairs)
    hits = median(lambda p: p["with"]["rps"] / p["without"]["rps"])
    p50 = median(lambda p: p["with"]["lag_p50_s"] - p["without"]["lag_p50_s"])
    p99 = median(lambda p: p["with"]["lag_p99_s"] - p["without"]["lag_p99_s"])
    drain = median(lambda p: p["with"]["drain_s"])
    each = ", ".join(fmt(p["with"]["rps"] / p["without"]["rps"]) for p in pairs)
    return [
        _target(f"hits c=64 with / without the barrier within {HITS_WITHIN:.0%} (pairs {each})",
                hits, abs(hits - 1) <= HITS_WITHIN),
        _target(f"lag p50 added ≤ one round trip ({rt * 1000:.2f} ms), in ms", p50 * 1000,
                p50 <= rt),
        _target(f"lag p99 added ≤ one round trip ({rt * 1000:.2f} ms), in ms", p99 * 1000,
                p99 <= rt),
        _target(f"with the barrier, pending drained within {DRAIN_TARGET_S:g} s of the load",
                drain, drain <= DRAIN_TARGET_S),
    ]


def _target(what: str, value: float, passed: bool) -> dict:
    return {"target": what, "value": value, "result": "PASS" if passed else "MISS"}

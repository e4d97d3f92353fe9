#!/usr/bin/env python3
"""Plant Store benchmark driver (Python 3.11, stdlib only). Start it through bench/run.

One run measures everything it reports: the service (SQLite and PostgreSQL) under wrk, the raw
database anchors (sqlite-raw, pgbench) and an HTTP ceiling (nginx), all on this machine, now.
See bench/README.md. Figures from different runs must never be compared.
"""

from __future__ import annotations

import collections
import datetime
import glob
import json
import math
import os
import re
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
LUA = BENCH / "wrk.lua"

CONNS = (1, 16, 64)
WORKLOADS = ("hits", "misses", "401s")
BACKENDS = ("sqlite", "postgres")
BACKEND_NAME = {"sqlite": "SQLite", "postgres": "PostgreSQL"}
EXPECT = {"hits": "204", "misses": "404", "401s": "401", "nginx": "204"}
LUA_MODE = {"hits": "hit", "misses": "miss", "401s": "noauth", "nginx": "noauth"}
# Ids that are never seeded: misses and 401s ask for these, so neither can delete anything even
# if the service were wrong about authentication.
MISS_FIRST = 1_000_000_000_000
NOAUTH_FIRST = 2_000_000_000_000
MIN_ROWS = 1_000_000
# Each deleting run gets its own id range. Service hit runs reached 26,000 deletes a second
# here (and ran out of a 25,000-a-second range once), so they get 60,000; the raw anchors
# (pgbench at most about 20,000 tps, sqlite-raw about 10,000) get twice 25,000.
IDS_PER_SECOND = 60_000
RAW_IDS_PER_SECOND = 25_000
READYZ_STARTS = 5
READYZ_POLL_S = 0.002

# Targets from the issue.
T_HITS_VS_RAW = 2.0
T_HITS_VS_OWN_401 = 0.8
T_401_VS_NGINX = 0.5
T_P50_VS_RAW = 1.5
T_RSS_MIB = 30.0
T_READYZ_MS = 200.0


class Interrupted(Exception):
    pass


def on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def log(msg: str = "") -> None:
    print(msg, flush=True)


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not value.isdigit() or int(value) <= 0:
        sys.exit(f"bench: {name} must be a positive integer, not {value!r}")
    return int(value)


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(sorted_values)))
    return sorted_values[rank - 1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fmt(x, digits=2) -> str:
    if x is None:
        return "n/a"
    return f"{x:,.{digits}f}"


def fmt_rate(x) -> str:
    return "n/a" if x is None else f"{x:,.0f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt_ratio(r) -> str:
    return "n/a" if r is None else f"{r:.2f}×"


# --------------------------------------------------------------------------------------------
# Processes started by the harness (service, nginx): all stopped on exit, Ctrl-C or error.


class Procs:
    def __init__(self):
        self.live: list[subprocess.Popen] = []

    def start(self, cmd, **kw) -> subprocess.Popen:
        # A session of its own: Ctrl-C reaches the driver, which stops these in order.
        proc = subprocess.Popen(cmd, start_new_session=True, **kw)
        self.live.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen, sig=signal.SIGTERM, timeout=30.0) -> int | None:
        if proc.poll() is None:
            try:
                proc.send_signal(sig)
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc in self.live:
            self.live.remove(proc)
        return proc.returncode

    def stop_all(self):
        for proc in list(self.live):
            self.stop(proc, timeout=10.0)


PROCS = Procs()


def run(cmd, *, timeout=None, env=None, cwd=None, check=True) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )
    if check and res.returncode != 0:
        raise RuntimeError(
            f"{Path(str(cmd[0])).name} exited with {res.returncode}: "
            f"{(res.stderr or res.stdout).strip()[-2000:]}"
        )
    return res


# --------------------------------------------------------------------------------------------
# Machine and disk


def machine_info() -> dict:
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gib = int(line.split()[1]) / 1024 / 1024
    except OSError:
        pass
    commit = "unknown"
    try:
        commit = run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"]).stdout.strip()
        dirty = run(["git", "--no-optional-locks", "-C", ROOT, "status", "--porcelain",
                     "--untracked-files=no"]).stdout
        if dirty.strip():
            commit += " (+ uncommitted changes)"
    except (RuntimeError, OSError):
        pass
    return {
        "nproc": len(os.sched_getaffinity(0)),
        "kernel": os.uname().release,
        "cpu_model": model,
        "mem_gib": mem_gib,
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": commit,
    }


def filesystem_of(path: Path) -> str:
    try:
        out = run(["df", "--output=source,fstype,target", path]).stdout.splitlines()[-1].split()
        return f"{out[1]} {out[0]} mounted on {out[2]}"
    except (RuntimeError, OSError, IndexError):
        return "unknown"


def measure_fsync(directory: Path, seconds: float = 2.0) -> dict:
    """4 KiB pwrite + fsync of one file in `directory`, in a loop for `seconds`."""
    path = directory / "fsync-probe"
    buf = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    lat = []
    try:
        os.pwrite(fd, buf, 0)
        os.fsync(fd)  # the file exists on disk before timing starts
        start = time.perf_counter()
        while True:
            t = time.perf_counter()
            os.pwrite(fd, buf, 0)
            os.fsync(fd)
            now = time.perf_counter()
            lat.append(now - t)
            if now - start >= seconds:
                break
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    lat.sort()
    return {
        "fsyncs": len(lat),
        "seconds": elapsed,
        "fsyncs_per_s": len(lat) / elapsed,
        "ms_per_fsync": elapsed / len(lat) * 1000,
        "p50_ms": percentile(lat, 50) * 1000,
        "p99_ms": percentile(lat, 99) * 1000,
        "directory": str(directory),
        "filesystem": filesystem_of(directory),
    }


# --------------------------------------------------------------------------------------------
# Databases


class Postgres:
    def __init__(self, admin_url: str, db: str):
        self.admin_url = admin_url
        self.db = db
        base, _, _ = admin_url.partition("?")
        self.url = base.rsplit("/", 1)[0] + "/" + db
        self.created = False

    def psql(self, *sql: str, url: str | None = None) -> str:
        cmd = ["psql", url or self.url, "-v", "ON_ERROR_STOP=1", "-qAtX"]
        for s in sql:
            cmd += ["-c", s]
        return run(cmd, timeout=600).stdout.strip()

    def scalar(self, sql: str) -> int:
        return int(self.psql(sql).splitlines()[-1])

    def recreate(self):
        self.psql(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)', url=self.admin_url)
        self.psql(f'CREATE DATABASE "{self.db}"', url=self.admin_url)
        self.created = True

    def drop(self):
        if self.created:
            self.psql(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)', url=self.admin_url)
            self.created = False

    def settle(self, vacuum: bool):
        """Between runs: the previous run's dead rows vacuumed, dirty pages written out."""
        if vacuum:
            self.psql("VACUUM plants", "VACUUM plantstore_deletions")
        self.psql("CHECKPOINT")

    def data_directory(self) -> str | None:
        try:
            return self.psql("SHOW data_directory")
        except RuntimeError:
            return None

    def version(self) -> str:
        return self.psql("SHOW server_version")


class Sqlite:
    def __init__(self, path: Path):
        self.path = path
        self.url = f"sqlite://{path}?mode=rwc"

    def remove(self):
        for suffix in ("", "-wal", "-shm", "-journal"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def scalar(self, sql: str) -> int:
        con = sqlite3.connect(self.path, timeout=30)
        try:
            return int(con.execute(sql).fetchone()[0])
        finally:
            con.close()

    def settle(self, vacuum: bool):
        """Between runs (no writer open): the WAL checkpointed into the database and truncated."""
        con = sqlite3.connect(self.path, timeout=30)
        try:
            con.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        finally:
            con.close()


# --------------------------------------------------------------------------------------------
# The service


def service_env() -> dict:
    # Product defaults only: no DATABASE_URL / PLANTSTORE_* (rate limit, pool size, ...) from the
    # caller's environment; the working directory is the run's work dir, so no .env is read.
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith("PLANTSTORE_") or k == "DATABASE_URL" or k == "RUST_LOG")
    }
    env["RUST_LOG"] = "info"
    return env


class Service:
    def __init__(self, binary: Path, work: Path):
        self.binary = binary
        self.work = work

    def cli(self, url: str, *args: str, timeout=3600) -> str:
        res = run(
            [self.binary, "--database-url", url, *args],
            timeout=timeout,
            env=service_env(),
            cwd=self.work,
        )
        return res.stdout

    def start(self, url: str, port: int, logfile: Path) -> subprocess.Popen:
        out = open(logfile, "ab")
        try:
            return PROCS.start(
                [str(self.binary), "--database-url", url, "serve", "--listen", f"127.0.0.1:{port}"],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=service_env(),
                cwd=self.work,
            )
        finally:
            out.close()


def http_status(port: int, path: str, timeout=1.0) -> int | None:
    """Status of one GET on a fresh connection, or None when nothing answers yet."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
            s.sendall(
                f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()
            )
            head = b""
            while b"\r\n" not in head:
                chunk = s.recv(256)
                if not chunk:
                    return None
                head += chunk
            parts = head.split(b"\r\n", 1)[0].split()
            return int(parts[1]) if len(parts) >= 2 else None
    except (OSError, ValueError):
        return None


def wait_ready(proc: subprocess.Popen, port: int, path: str, ok: int, logfile: Path | None,
               timeout: float, started: float) -> float:
    """Poll until `path` answers `ok`; returns seconds since `started`."""
    while True:
        if http_status(port, path) == ok:
            return time.perf_counter() - started
        if proc.poll() is not None:
            tail = ""
            if logfile and logfile.exists():
                tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before {path} "
                               f"answered {ok}:\n{tail}")
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"{proc.args[0]}: {path} did not answer {ok} in {timeout:.0f} s")
        time.sleep(READYZ_POLL_S)


def trim_log(path: Path, keep: int = 40) -> int:
    """Cut a service log (one line per request at RUST_LOG=info) to its first and last `keep`
    lines; returns how many lines it had."""
    head, tail, n = [], collections.deque(maxlen=keep), 0
    with open(path, "rb") as f:
        for line in f:
            n += 1
            if n <= keep:
                head.append(line)
            else:
                tail.append(line)
    if n > 2 * keep:
        cut = n - len(head) - len(tail)
        with open(path, "wb") as f:
            f.writelines(head)
            f.write(f"[... {cut} lines cut by bench/run; BENCH_KEEP=1 keeps them ...]\n".encode())
            f.writelines(tail)
    return n


def proc_status_mib(pid: int, field: str) -> float | None:
    """A memory figure of /proc/PID/status (such as VmHWM or VmRSS), in MiB."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def vm_hwm_mib(pid: int) -> float | None:
    return proc_status_mib(pid, "VmHWM")


# --------------------------------------------------------------------------------------------
# wrk


def run_wrk(port: int, mode: str, conns: int, first: int, end: int, seconds: int, token: str,
            out: Path) -> dict:
    threads = 1 if conns == 1 else 2
    cmd = ["wrk", f"-t{threads}", f"-c{conns}", f"-d{seconds}s", "--latency", "--timeout", "10s",
           "-s", LUA, f"http://127.0.0.1:{port}", "--", mode, first, end, threads]
    env = dict(os.environ, BENCH_TOKEN=token)
    res = run(cmd, timeout=seconds + 120, env=env)
    out.write_text(res.stdout + res.stderr)
    line = next((l for l in res.stdout.splitlines() if l.startswith("BENCH_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk printed no BENCH_JSON line (see {out})")
    data = json.loads(line[len("BENCH_JSON "):])
    data["threads_n"] = threads
    data["connections"] = conns
    data["generated"] = sum(t["generated"] for t in data["threads"])
    data["exhausted"] = sum(t["exhausted"] for t in data["threads"])
    return data


def unexpected(data: dict, expect: str) -> dict:
    """Statuses other than the expected one, plus socket errors and timeouts."""
    odd = {code: n for code, n in data["statuses"].items() if code != expect and n}
    for kind in ("connect", "read", "write", "timeout"):
        if data["errors"].get(kind):
            odd[kind] = data["errors"][kind]
    if data.get("exhausted"):
        odd["ids exhausted"] = data["exhausted"]
    return odd


def fmt_unexpected(odd: dict) -> str:
    return "none" if not odd else ", ".join(f"{k}: {v}" for k, v in odd.items())


# --------------------------------------------------------------------------------------------
# Checks against the database


def issued_case(lo: int, data: dict) -> str:
    """SQL predicate: `id` was sent by wrk (thread t sends lo+t, lo+t+T, ...; k_t of them)."""
    stride = data["threads_n"]
    whens = " ".join(f"WHEN {t['tid']} THEN {t['generated']}" for t in data["threads"])
    return f"(id - {lo}) / {stride} < CASE (id - {lo}) % {stride} {whens} ELSE 0 END"


def verify_hits(db, lo: int, hi: int, before: int, data: dict) -> dict:
    """Every 204 matched a deleted row and an audit row, for ids [lo, hi).

    wrk stops at the deadline with up to one request per connection sent but its response never
    read, so the rows deleted may exceed the 204s by at most that many (`unanswered`: requests
    generated minus responses read; wrk 4 also calls request() once at start-up on thread 0 to
    check the script and never sends that one, so the bound is loose by one, never too tight).
    """
    rng = f"id >= {lo} AND id < {hi}"
    present = db.scalar(f"SELECT count(*) FROM plants WHERE {rng}")
    deleted = before - present
    stride = data["threads_n"]
    issued = 0
    for t in data["threads"]:
        in_range = max(0, math.ceil((hi - lo - t["tid"]) / stride))
        issued += min(t["generated"], in_range)
    present_issued = db.scalar(f"SELECT count(*) FROM plants WHERE {rng} AND {issued_case(lo, data)}")
    deleted_outside = deleted - (issued - present_issued)
    arng = f"plant_id >= {lo} AND plant_id < {hi}"
    audit = db.scalar(f"SELECT count(*) FROM plantstore_deletions WHERE {arng}")
    audit_distinct = db.scalar(f"SELECT count(DISTINCT plant_id) FROM plantstore_deletions WHERE {arng}")
    audit_live = db.scalar(
        f"SELECT count(*) FROM plantstore_deletions d WHERE {arng.replace('plant_id', 'd.plant_id')} "
        "AND EXISTS (SELECT 1 FROM plants p WHERE p.id = d.plant_id)"
    )
    n204 = int(data["statuses"].get("204", 0))
    unanswered = max(0, data["generated"] - data["responses"])
    problems = []
    if before != hi - lo:
        problems.append(f"range had {before} rows before the run, not {hi - lo}")
    if audit != deleted:
        problems.append(f"audit rows {audit} != rows deleted {deleted}")
    if audit_distinct != audit:
        problems.append(f"{audit - audit_distinct} plants audited twice")
    if audit_live:
        problems.append(f"{audit_live} audit rows for plants that still exist")
    if deleted_outside:
        problems.append(f"{deleted_outside} rows deleted that no request asked for")
    if deleted < n204:
        problems.append(f"204s {n204} > rows deleted {deleted}")
    elif deleted - n204 > unanswered:
        problems.append(f"rows deleted {deleted} exceed 204s {n204} by more than the "
                        f"{unanswered} requests left unanswered at wrk's deadline")
    return {
        "lo": lo, "hi": hi, "rows_before": before, "n204": n204, "deleted": deleted,
        "audit": audit, "audit_live": audit_live, "deleted_outside": deleted_outside,
        "unanswered": unanswered, "ok": not problems, "problems": problems,
    }


def describe_hits_check(v: dict) -> str:
    gap = v["deleted"] - v["n204"]
    s = (f"ids [{v['lo']}, {v['hi']}): 204s {v['n204']}, rows deleted {v['deleted']}, "
         f"audit rows {v['audit']}, audit rows of live plants {v['audit_live']}, "
         f"deleted but never asked for {v['deleted_outside']}")
    if gap:
        s += f", deleted without a 204 read {gap} (≤ {v['unanswered']} in flight at wrk's deadline)"
    return s + (" -> OK" if v["ok"] else " -> FAIL: " + "; ".join(v["problems"]))


def count_range(db, lo: int, hi: int) -> int:
    return db.scalar(f"SELECT count(*) FROM plants WHERE id >= {lo} AND id < {hi}")


def verify_blocks(db, lo: int, hi: int, before: int, per: int, counts: dict[int, int],
                  total: int) -> dict:
    """Raw anchors: client c deleted exactly ids lo+c*per .. lo+c*per+counts[c]-1, one each."""
    rng = f"id >= {lo} AND id < {hi}"
    present = db.scalar(f"SELECT count(*) FROM plants WHERE {rng}")
    deleted = before - present
    whens = " ".join(f"WHEN {c} THEN {n}" for c, n in sorted(counts.items()))
    left = db.scalar(
        f"SELECT count(*) FROM plants WHERE {rng} AND "
        f"(id - {lo}) % {per} < CASE (id - {lo}) / {per} {whens or 'WHEN -1 THEN 0'} ELSE 0 END"
    )
    problems = []
    if before != hi - lo:
        problems.append(f"range had {before} rows before the run, not {hi - lo}")
    if deleted != total:
        problems.append(f"rows deleted {deleted} != transactions {total}")
    if left:
        problems.append(f"{left} ids that a transaction should have deleted are still there")
    if any(n > per for n in counts.values()):
        problems.append("a client ran past its id range")
    return {"lo": lo, "hi": hi, "deleted": deleted, "transactions": total, "not_deleted": left,
            "ok": not problems, "problems": problems}


def describe_blocks_check(v: dict) -> str:
    s = (f"ids [{v['lo']}, {v['hi']}): transactions {v['transactions']}, rows deleted "
         f"{v['deleted']}, ids left undeleted {v['not_deleted']}")
    return s + (" -> OK" if v["ok"] else " -> FAIL: " + "; ".join(v["problems"]))


# --------------------------------------------------------------------------------------------
# Anchors


PGBENCH_SCRIPT = r"""-- bench/run: one prepared single-row DELETE per transaction. Variables persist per client
-- across transactions: client c deletes :first + c*:per + 0, 1, 2, ... (its own block); past
-- the block it asks for id 0, which does not exist, and the row count check fails.
\set id case when :n < :per then :first + :client_id * :per + :n else 0 end
\set n :n + 1
DELETE FROM plants WHERE id = :id;
"""


def pgbench_binary() -> str:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"),
                   key=lambda p: [int(x) for x in re.findall(r"\d+", p)])
    if found:
        return found[-1]
    path = shutil.which("pgbench")
    if path:
        return path
    raise RuntimeError("pgbench not found (/usr/lib/postgresql/*/bin/pgbench or PATH)")


def run_pgbench(pg: Postgres, clients: int, lo: int, hi: int, seconds: int, work: Path) -> dict:
    per = (hi - lo) // clients
    script = work / "pgbench-delete.sql"
    script.write_text(PGBENCH_SCRIPT)
    logdir = work / f"pgbench-{clients}"
    shutil.rmtree(logdir, ignore_errors=True)
    logdir.mkdir()
    jobs = 1 if clients == 1 else 2
    before = count_range(pg, lo, hi)
    cmd = [pgbench_binary(), "-n", "-M", "prepared", "-f", script, "-c", clients, "-j", jobs,
           "-T", seconds, "-l", "--log-prefix", logdir / "tx",
           "-D", f"first={lo}", "-D", f"per={per}", "-D", "n=0", pg.url]
    res = run(cmd, timeout=seconds + 300, cwd=logdir)
    (work / f"pgbench-{clients}.out").write_text(res.stdout + res.stderr)
    text = res.stdout
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
    processed = re.search(r"number of transactions actually processed: (\d+)", text)
    failed = re.search(r"number of failed transactions: (\d+)", text)
    if not tps or not processed:
        raise RuntimeError(f"could not read pgbench's output:\n{text}")
    lat_us = []
    counts: dict[int, int] = {}
    for f in sorted(logdir.glob("tx*")):
        with open(f) as fh:
            for line in fh:
                fields = line.split()
                if len(fields) < 3:
                    continue
                client = int(fields[0])
                counts[client] = counts.get(client, 0) + 1
                lat_us.append(int(fields[2]))
    lat_us.sort()
    total = int(processed.group(1))
    check = verify_blocks(pg, lo, hi, before, per, counts, total)
    if len(lat_us) != total:
        check["ok"] = False
        check["problems"].append(f"log has {len(lat_us)} transactions, pgbench reported {total}")
    shutil.rmtree(logdir, ignore_errors=True)
    return {
        "clients": clients, "jobs": jobs, "rps": float(tps.group(1)), "transactions": total,
        "failed": int(failed.group(1)) if failed else 0, "per_client_ids": per,
        "p50_ms": percentile(lat_us, 50) / 1000 if lat_us else None,
        "p99_ms": percentile(lat_us, 99) / 1000 if lat_us else None,
        "check": check,
    }


def run_sqlite_raw(binary: Path, db: Sqlite, lo: int, hi: int, seconds: int, work: Path) -> dict:
    before = count_range(db, lo, hi)
    res = run([binary, db.url, lo, seconds], timeout=seconds + 300)
    (work / "sqlite-raw.out").write_text(res.stdout + res.stderr)
    lines = [l for l in res.stdout.splitlines() if l.strip().startswith("{")]
    if not lines:
        raise RuntimeError(f"sqlite-raw printed no JSON line:\n{res.stdout}{res.stderr}")
    data = json.loads(lines[-1])
    deleted = int(data["deleted"])
    # Statements run (when it reports them): each must have deleted its own id, lo, lo+1, ...
    statements = int(data.get("statements", deleted))
    check = verify_blocks(db, lo, hi, before, hi - lo, {0: statements}, statements)
    if statements != deleted:
        check["ok"] = False
        check["problems"].append(f"{statements - deleted} of its DELETEs found no row")
    return {"rps": deleted / float(data["seconds"]), "deleted": deleted, "statements": statements,
            "seconds": float(data["seconds"]), "p50_ms": data.get("p50_ms"),
            "p99_ms": data.get("p99_ms"), "check": check}


NGINX_CONF = """# bench/run: the HTTP ceiling, nginx answering every request with 204 on loopback.
worker_processes auto;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    # One connection serves the whole run, as the service's keep-alive does (nginx would
    # otherwise close it every 1,000 requests).
    keepalive_requests 100000000;
    client_body_temp_path {dir}/client_body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 204; }}
    }}
}}
"""


def nginx_binary() -> str:
    path = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)
    if not path:
        raise RuntimeError("nginx not found")
    return path


# --------------------------------------------------------------------------------------------
# Report


def result_rows(R: dict) -> list[dict]:
    rows = []
    raw_sqlite = R["anchors"]["sqlite-raw"]
    for backend in BACKENDS:
        for workload in WORKLOADS:
            for conns in CONNS:
                r = R["service"][backend][workload][str(conns)]
                if workload == "hits":
                    if backend == "sqlite":
                        anchor, aname = raw_sqlite, "sqlite-raw"
                    else:
                        anchor, aname = R["anchors"]["pgbench"][str(conns)], f"pgbench {conns}"
                else:
                    anchor, aname = R["anchors"]["nginx"][str(conns)], f"nginx {conns}"
                check = r.get("check")
                rows.append({
                    "backend": backend, "what": workload, "conns": conns, "rps": r["rps"],
                    "p50": r["p50_ms"], "p99": r["p99_ms"], "rss": r["peak_rss_mib"],
                    "anchor": aname, "ratio": ratio(r["rps"], anchor["rps"]),
                    "odd": fmt_unexpected(r["unexpected"]),
                    "check": "—" if check is None else ("OK" if check["ok"] else "FAIL"),
                })
    rows.append({"backend": "sqlite", "what": "sqlite-raw (anchor)", "conns": 1,
                 "rps": raw_sqlite["rps"], "p50": raw_sqlite["p50_ms"], "p99": raw_sqlite["p99_ms"],
                 "rss": None, "anchor": "—", "ratio": None, "odd": "none",
                 "check": "OK" if raw_sqlite["check"]["ok"] else "FAIL"})
    for conns in CONNS:
        a = R["anchors"]["pgbench"][str(conns)]
        rows.append({"backend": "postgres", "what": "pgbench (anchor)", "conns": conns,
                     "rps": a["rps"], "p50": a["p50_ms"], "p99": a["p99_ms"], "rss": None,
                     "anchor": "—", "ratio": None,
                     "odd": "none" if not a["failed"] else f"failed: {a['failed']}",
                     "check": "OK" if a["check"]["ok"] else "FAIL"})
    for conns in CONNS:
        a = R["anchors"]["nginx"][str(conns)]
        rows.append({"backend": "—", "what": "nginx 204 (anchor)", "conns": conns, "rps": a["rps"],
                     "p50": a["p50_ms"], "p99": a["p99_ms"], "rss": None, "anchor": "—",
                     "ratio": None, "odd": fmt_unexpected(a["unexpected"]), "check": "—"})
    return rows


def markdown_table(rows: list[dict]) -> str:
    head = ("| backend | workload | conns | req/s | p50 ms | p99 ms | peak RSS MiB | anchor | "
            "ratio | unexpected | check |")
    out = [head, "|---|---|--:|--:|--:|--:|--:|---|--:|---|---|"]
    for r in rows:
        out.append(
            f"| {r['backend']} | {r['what']} | {r['conns']} | {fmt_rate(r['rps'])} | "
            f"{fmt(r['p50'])} | {fmt(r['p99'])} | {'—' if r['rss'] is None else fmt(r['rss'], 1)} | "
            f"{r['anchor']} | {fmt_ratio(r['ratio']) if r['anchor'] != '—' else '—'} | "
            f"{r['odd']} | {r['check']} |"
        )
    return "\n".join(out)


def targets(R: dict) -> list[dict]:
    S = R["service"]
    A = R["anchors"]
    out = []

    def add(name, measured, value, limit, higher_is_better, note=""):
        if value is None:
            verdict = "MISS"
        else:
            verdict = "PASS" if (value >= limit if higher_is_better else value <= limit) else "MISS"
        out.append({"target": name, "measured": measured, "value": value, "limit": limit,
                    "higher_is_better": higher_is_better, "result": verdict, "note": note})

    for backend, anchor, aname in (("postgres", A["pgbench"]["64"], "pgbench at 64 clients"),
                                   ("sqlite", A["sqlite-raw"], "sqlite-raw")):
        name = BACKEND_NAME[backend]
        hits = S[backend]["hits"]["64"]["rps"]
        own401 = S[backend]["401s"]["64"]["rps"]
        r = ratio(hits, anchor["rps"])
        add(f"{name} hits at 64 ≥ {T_HITS_VS_RAW:g}× {aname}",
            f"{fmt_rate(hits)} / {fmt_rate(anchor['rps'])} req/s", r, T_HITS_VS_RAW, True)
        r = ratio(hits, own401)
        add(f"{name} hits at 64 ≥ {T_HITS_VS_OWN_401:g}× its own 401s at 64 (alternative)",
            f"{fmt_rate(hits)} / {fmt_rate(own401)} req/s", r, T_HITS_VS_OWN_401, True)
    nginx64 = A["nginx"]["64"]["rps"]
    for backend in BACKENDS:
        v = S[backend]["401s"]["64"]["rps"]
        add(f"{BACKEND_NAME[backend]} 401s at 64 ≥ {T_401_VS_NGINX:g}× nginx at 64",
            f"{fmt_rate(v)} / {fmt_rate(nginx64)} req/s", ratio(v, nginx64), T_401_VS_NGINX, True)
    for backend, anchor, aname in (("sqlite", A["sqlite-raw"], "sqlite-raw"),
                                   ("postgres", A["pgbench"]["1"], "pgbench at 1 client")):
        v = S[backend]["hits"]["1"]["p50_ms"]
        add(f"{BACKEND_NAME[backend]} hits at 1: p50 ≤ {T_P50_VS_RAW:g}× {aname} p50",
            f"{fmt(v, 3)} / {fmt(anchor['p50_ms'], 3)} ms", ratio(v, anchor["p50_ms"]),
            T_P50_VS_RAW, False)
    rss = [(S[b][w]["64"]["peak_rss_mib"], f"{b} {w}") for b in BACKENDS for w in WORKLOADS
           if S[b][w]["64"]["peak_rss_mib"] is not None]
    top = max(rss) if rss else (None, "")
    add(f"peak RSS at 64 connections ≤ {T_RSS_MIB:g} MiB (max over the 64-connection runs)",
        f"{fmt(top[0], 1)} MiB ({top[1]})", top[0], T_RSS_MIB, False)
    rz = R["readyz"]
    add(f"SQLite start to /readyz 200 ≤ {T_READYZ_MS:g} ms (median of {READYZ_STARTS})",
        f"{fmt(rz['median_ms'], 1)} ms (starts: {', '.join(fmt(x, 1) for x in rz['ms'])})",
        rz["median_ms"], T_READYZ_MS, False)
    return out


def targets_table(ts: list[dict]) -> str:
    out = ["| target | measured | ratio / value | result |", "|---|---|--:|---|"]
    for t in ts:
        if "MiB" in t["target"]:
            value = f"{fmt(t['value'], 1)} MiB"
        elif "ms (median" in t["target"]:
            value = f"{fmt(t['value'], 1)} ms"
        else:
            value = fmt_ratio(t["value"])
        out.append(f"| {t['target']} | {t['measured']} | {value} | **{t['result']}** |")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Chart (hand-written SVG)


def nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def short(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 100_000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}".removesuffix(".0") + "k"
    return f"{v:.0f}"


def bar_label(v: float) -> str:
    return f"{v:,.0f}" if v < 10_000 else f"{v / 1000:.1f}k"


def esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def chart_svg(R: dict) -> str:
    S, A = R["service"], R["anchors"]
    c = [str(n) for n in CONNS]
    panels = [
        {"title": "SQLite: DELETE that deletes (hits)", "xlabel": "connections",
         "series": [("service hits", "#2b6cb0", [S["sqlite"]["hits"][k]["rps"] for k in c]),
                    ("sqlite-raw (1 writer, same at every count)", "#dd6b20",
                     [A["sqlite-raw"]["rps"]] * 3)]},
        {"title": "PostgreSQL: DELETE that deletes (hits)",
         "xlabel": "connections (pgbench: clients)",
         "series": [("service hits", "#2b6cb0", [S["postgres"]["hits"][k]["rps"] for k in c]),
                    ("pgbench prepared DELETE (clients = conns)", "#dd6b20",
                     [A["pgbench"][k]["rps"] for k in c])]},
        {"title": "401s (no token) vs nginx return 204", "xlabel": "connections",
         "series": [("SQLite service 401s", "#2b6cb0", [S["sqlite"]["401s"][k]["rps"] for k in c]),
                    ("PostgreSQL service 401s", "#38a169",
                     [S["postgres"]["401s"][k]["rps"] for k in c]),
                    ("nginx return 204", "#718096", [A["nginx"][k]["rps"] for k in c])]},
    ]
    pw, ph, gap = 420, 400, 24
    left, right, top, bottom = 70, 14, 104, 56
    width = 3 * pw + 2 * gap + 40
    height = ph + 96
    m = R["machine"]
    f = R["fsync"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, Helvetica, sans-serif">',
         f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
         f'<text x="20" y="30" font-size="19" font-weight="bold" fill="#1a202c">Plant Store '
         f'DELETE /plants/{{id}}: requests per second by connection count</text>',
         f'<text x="20" y="52" font-size="12.5" fill="#4a5568">{esc(m["date"])} · {m["nproc"]} '
         f'cores · {esc(m["cpu_model"])} · kernel {esc(m["kernel"])} · disk {f["fsyncs_per_s"]:,.0f} '
         f'fsyncs/s · {R["config"]["seconds"]} s per run · commit {esc(m["commit"])}</text>',
         f'<text x="20" y="70" font-size="12.5" fill="#c53030">One run of bench/run; '
         f'never compare these bars with another run\'s.</text>']
    for i, panel in enumerate(panels):
        x0 = 20 + i * (pw + gap)
        y0 = 84
        px, py = x0 + left, y0 + top
        plot_w, plot_h = pw - left - right, ph - top - bottom
        vals = [v for _, _, vs in panel["series"] for v in vs if v is not None]
        vmax = max(vals) if vals else 1.0
        step = nice_step(vmax * 1.12 or 1.0)
        ymax = step * math.ceil(vmax * 1.12 / step) if vmax > 0 else step * 5
        o.append(f'<rect x="{x0}" y="{y0}" width="{pw}" height="{ph}" fill="#f7fafc" '
                 f'stroke="#e2e8f0"/>')
        o.append(f'<text x="{x0 + 12}" y="{y0 + 24}" font-size="14" font-weight="bold" '
                 f'fill="#1a202c">{esc(panel["title"])}</text>')
        for j, (name, color, _) in enumerate(panel["series"]):
            ly = y0 + 42 + j * 17
            o.append(f'<rect x="{x0 + 12}" y="{ly - 10}" width="12" height="12" fill="{color}"/>')
            o.append(f'<text x="{x0 + 30}" y="{ly}" font-size="12" fill="#2d3748">{esc(name)}</text>')
        # y axis: grid, ticks, label
        t = 0.0
        while t <= ymax + step / 2:
            y = py + plot_h - t / ymax * plot_h
            o.append(f'<line x1="{px}" y1="{y:.1f}" x2="{px + plot_w}" y2="{y:.1f}" '
                     f'stroke="{"#a0aec0" if t == 0 else "#e2e8f0"}"/>')
            o.append(f'<text x="{px - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
                     f'fill="#4a5568">{short(t)}</text>')
            t += step
        o.append(f'<line x1="{px}" y1="{py}" x2="{px}" y2="{py + plot_h}" stroke="#a0aec0"/>')
        cy = py + plot_h / 2
        o.append(f'<text x="{x0 + 16}" y="{cy:.1f}" font-size="12" text-anchor="middle" '
                 f'fill="#2d3748" transform="rotate(-90 {x0 + 16} {cy:.1f})">requests / s</text>')
        # bars
        n = len(panel["series"])
        group_w = plot_w / len(CONNS)
        bar_w = group_w * 0.78 / n
        for g, conns in enumerate(CONNS):
            gx = px + g * group_w + group_w * 0.11
            for j, (_, color, vs) in enumerate(panel["series"]):
                v = vs[g]
                bx = gx + j * bar_w
                if v is None:
                    o.append(f'<text x="{bx + bar_w / 2:.1f}" y="{py + plot_h - 4}" font-size="10" '
                             f'text-anchor="middle" fill="#718096">n/a</text>')
                    continue
                bh = v / ymax * plot_h
                o.append(f'<rect x="{bx + 1:.1f}" y="{py + plot_h - bh:.1f}" width="{bar_w - 2:.1f}" '
                         f'height="{bh:.1f}" fill="{color}"><title>{v:,.0f} req/s</title></rect>')
                o.append(f'<text x="{bx + bar_w / 2:.1f}" y="{py + plot_h - bh - 4:.1f}" '
                         f'font-size="10" text-anchor="middle" fill="#1a202c">{bar_label(v)}</text>')
            o.append(f'<text x="{px + g * group_w + group_w / 2:.1f}" y="{py + plot_h + 18}" '
                     f'font-size="12" text-anchor="middle" fill="#2d3748">{conns}</text>')
        o.append(f'<text x="{px + plot_w / 2:.1f}" y="{py + plot_h + 40}" font-size="12" '
                 f'text-anchor="middle" fill="#2d3748">{esc(panel["xlabel"])}</text>')
    o.append("</svg>")
    return "\n".join(o) + "\n"


# --------------------------------------------------------------------------------------------
# Main


def main() -> int:
    seconds = env_int("BENCH_SECONDS", 10)
    out_dir = Path(os.environ.get("BENCH_OUT") or BENCH / "out").resolve()
    plantstore = Path(os.environ.get("BENCH_PLANTSTORE_BIN") or ROOT / "target/release/plantstore")
    sqlite_raw_bin = Path(os.environ.get("BENCH_SQLITE_RAW_BIN") or ROOT / "target/release/sqlite-raw")
    pg_admin = os.environ.get("BENCH_PG_ADMIN_URL") or "postgres://postgres@127.0.0.1:5432/postgres"
    pg_db = os.environ.get("BENCH_PG_DB") or "plantstore_bench"
    keep = os.environ.get("BENCH_KEEP") == "1"
    for b in (plantstore, sqlite_raw_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"bench: {b} is missing; build it (bench/run without --no-build)")
    for tool in ("wrk", "psql"):
        if not shutil.which(tool):
            sys.exit(f"bench: {tool} is not installed")

    out_dir.mkdir(parents=True, exist_ok=True)
    work = out_dir / "work"
    marker = work / ".bench-work"
    if work.exists() and not marker.exists():
        sys.exit(f"bench: {work} exists and was not made by bench/run; choose another BENCH_OUT")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    marker.write_text("made by bench/run; emptied at the start of every run\n")

    # Id ranges: every deleting run its own [lo, hi), never shared, never reused.
    span = seconds * IDS_PER_SECOND
    raw_span = seconds * RAW_IDS_PER_SECOND

    class Ids:
        def __init__(self):
            self.next = 1

        def take(self, n):
            lo = self.next
            self.next += n
            return lo, self.next

    ids = {b: Ids() for b in BACKENDS}
    plan_hits = {b: {n: ids[b].take(span) for n in CONNS} for b in BACKENDS}
    # pgbench splits its range into one block per client; twice the span leaves each client
    # room for twice its even share (a client past its block asks for id 0 and the check fails).
    plan_pgbench = {n: ids["postgres"].take(2 * raw_span) for n in CONNS}
    # sqlite-raw has no bound of its own: its range is the highest, twice the span, so even an
    # overrun only reaches ids that were never seeded (and its check fails).
    plan_raw_sqlite = ids["sqlite"].take(2 * raw_span)
    rows = {b: max(MIN_ROWS, ids[b].next - 1) for b in BACKENDS}

    svc = Service(plantstore, work)
    pg = Postgres(pg_admin, pg_db)
    sq = Sqlite(work / "bench.db")
    R: dict = {"config": {"seconds": seconds, "ids_per_run": span, "rows": rows,
                          "connections": list(CONNS), "plantstore": str(plantstore),
                          "sqlite_raw": str(sqlite_raw_bin), "postgres_db": pg_db},
               "service": {b: {w: {} for w in WORKLOADS} for b in BACKENDS},
               "anchors": {"pgbench": {}, "nginx": {}}}
    failures: list[str] = []
    started_at = time.time()

    # Ctrl-C raises KeyboardInterrupt even when started with SIGINT ignored (e.g. from `&`).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        # ---- 1. machine and disk, before anything else touches the disk
        R["machine"] = m = machine_info()
        log(f"machine: {m['nproc']} cores, {m['cpu_model']}, kernel {m['kernel']}, "
            f"{fmt(m['mem_gib'], 1)} GiB, {m['date']}, commit {m['commit']}")
        R["fsync"] = f = measure_fsync(work)
        log(f"disk: {f['fsyncs_per_s']:,.0f} fsyncs/s, {f['ms_per_fsync']:.3f} ms per fsync "
            f"(p50 {f['p50_ms']:.3f}, p99 {f['p99_ms']:.3f} ms; 4 KiB pwrite+fsync for "
            f"{f['seconds']:.1f} s in {f['directory']}, {f['filesystem']}, beside the SQLite database)")
        log(f"runs: {seconds} s each; ids per deleting run {span:,}; rows seeded: SQLite "
            f"{rows['sqlite']:,}, PostgreSQL {rows['postgres']:,}")
        log("never compare these figures with another run's: everything below is from this run")

        # ---- 2. databases, fresh
        log("\n== preparing databases")
        sq.remove()
        pg.recreate()
        R["machine"]["postgres"] = pg.version()
        ddir = pg.data_directory()
        if ddir:
            same = os.path.exists(ddir) and os.stat(ddir).st_dev == os.stat(work).st_dev
            R["machine"]["postgres_data_directory_same_filesystem"] = same
            if not same:
                log(f"note: PostgreSQL's data directory {ddir} is not on the SQLite database's "
                    "filesystem, so the fsync rate above is the SQLite disk's only")
        tokens = {}
        for b, url, db in (("sqlite", sq.url, sq), ("postgres", pg.url, pg)):
            t0 = time.perf_counter()
            svc.cli(url, "migrate")
            svc.cli(url, "seed", "--count", str(rows[b]))
            seeded = time.perf_counter() - t0
            n = db.scalar(f"SELECT count(*) FROM plants WHERE id >= 1 AND id <= {rows[b]}")
            if n != rows[b]:
                raise RuntimeError(f"{b}: seeded {n} rows, wanted {rows[b]}")
            out = svc.cli(url, "token", "create", "--name", "bench").strip().splitlines()
            if not out or not out[-1].strip():
                raise RuntimeError(f"{b}: token create printed no token")
            tokens[b] = out[-1].strip()
            log(f"{BACKEND_NAME[b]}: migrated, {n:,} plants seeded in {seeded:.1f} s, token created")

        # ---- 3. HTTP ceiling: nginx
        log("\n== nginx (HTTP ceiling)")
        ndir = work / "nginx"
        ndir.mkdir()
        nport = free_port()
        (ndir / "nginx.conf").write_text(NGINX_CONF.format(dir=ndir, port=nport))
        with open(ndir / "stderr.log", "wb") as nerr:
            nginx = PROCS.start([nginx_binary(), "-p", ndir, "-e", ndir / "error.log", "-c",
                                 ndir / "nginx.conf"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=nerr)
        wait_ready(nginx, nport, "/", 204, ndir / "error.log", 30, time.perf_counter())
        for conns in CONNS:
            d = run_wrk(nport, "noauth", conns, NOAUTH_FIRST, 0, seconds, "",
                        work / f"wrk-nginx-{conns}.out")
            d["unexpected"] = unexpected(d, EXPECT["nginx"])
            R["anchors"]["nginx"][str(conns)] = d
            log(f"nginx      c={conns:<3} {fmt_rate(d['rps']):>9} req/s  p50 {fmt(d['p50_ms'], 3)} ms  "
                f"p99 {fmt(d['p99_ms'], 3)} ms  unexpected: {fmt_unexpected(d['unexpected'])}")
        PROCS.stop(nginx)

        def service_runs(backend, url, db):
            for workload in WORKLOADS:
                for conns in CONNS:
                    db.settle(vacuum=workload == "hits")
                    if workload == "hits":
                        lo, hi = plan_hits[backend][conns]
                        before = count_range(db, lo, hi)
                    elif workload == "misses":
                        lo, hi = MISS_FIRST, 0
                    else:
                        lo, hi = NOAUTH_FIRST, 0
                    port = free_port()
                    slog = work / f"service-{backend}-{workload}-{conns}.log"
                    proc = svc.start(url, port, slog)
                    wait_ready(proc, port, "/readyz", 200, slog, 120, time.perf_counter())
                    d = run_wrk(port, LUA_MODE[workload], conns, lo, hi, seconds, tokens[backend],
                                work / f"wrk-{backend}-{workload}-{conns}.out")
                    d["peak_rss_mib"] = vm_hwm_mib(proc.pid)
                    code = PROCS.stop(proc)
                    d["exit_code"] = code
                    d["unexpected"] = unexpected(d, EXPECT[workload])
                    d["log_lines"] = trim_log(slog) if not keep else None
                    R["service"][backend][workload][str(conns)] = d
                    line = (f"{backend:<8} {workload:<6} c={conns:<3} {fmt_rate(d['rps']):>9} req/s  "
                            f"p50 {fmt(d['p50_ms'], 3)} ms  p99 {fmt(d['p99_ms'], 3)} ms  "
                            f"peak RSS {fmt(d['peak_rss_mib'], 1)} MiB  "
                            f"unexpected: {fmt_unexpected(d['unexpected'])}")
                    if code not in (0, None):
                        line += f"  (exited {code} after SIGTERM; see {slog.name})"
                    log(line)
                    if workload == "hits":
                        v = verify_hits(db, lo, hi, before, d)
                        d["check"] = v
                        log(f"  check: {describe_hits_check(v)}")
                        if not v["ok"]:
                            failures.append(f"{backend} hits c={conns}: " + "; ".join(v["problems"]))

        # ---- 4. SQLite: raw anchor, service, start-up time
        log("\n== SQLite")
        lo, hi = plan_raw_sqlite
        sq.settle(vacuum=False)
        a = run_sqlite_raw(sqlite_raw_bin, sq, lo, hi, seconds, work)
        R["anchors"]["sqlite-raw"] = a
        log(f"sqlite-raw c=1   {fmt_rate(a['rps']):>9} del/s  p50 {fmt(a['p50_ms'], 3)} ms  "
            f"p99 {fmt(a['p99_ms'], 3)} ms")
        log(f"  check: {describe_blocks_check(a['check'])}")
        if not a["check"]["ok"]:
            failures.append("sqlite-raw: " + "; ".join(a["check"]["problems"]))
        service_runs("sqlite", sq.url, sq)

        sq.settle(vacuum=False)
        starts = []
        for i in range(READYZ_STARTS):
            port = free_port()
            slog = work / f"service-sqlite-start-{i + 1}.log"
            t0 = time.perf_counter()
            proc = svc.start(sq.url, port, slog)
            starts.append(wait_ready(proc, port, "/readyz", 200, slog, 60, t0) * 1000)
            PROCS.stop(proc)
        R["readyz"] = {"ms": starts, "median_ms": statistics.median(starts)}
        log(f"start to /readyz 200 (SQLite, {READYZ_STARTS} starts): median "
            f"{statistics.median(starts):.1f} ms ({', '.join(f'{x:.1f}' for x in starts)})")

        # ---- 5. PostgreSQL: raw anchor, service
        log("\n== PostgreSQL")
        for conns in CONNS:
            lo, hi = plan_pgbench[conns]
            pg.settle(vacuum=True)
            a = run_pgbench(pg, conns, lo, hi, seconds, work)
            R["anchors"]["pgbench"][str(conns)] = a
            log(f"pgbench    c={conns:<3} {fmt_rate(a['rps']):>9} tps    p50 {fmt(a['p50_ms'], 3)} ms  "
                f"p99 {fmt(a['p99_ms'], 3)} ms  failed: {a['failed']}")
            log(f"  check: {describe_blocks_check(a['check'])}")
            if not a["check"]["ok"]:
                failures.append(f"pgbench c={conns}: " + "; ".join(a["check"]["problems"]))
        service_runs("postgres", pg.url, pg)

        # ---- 6. report
        R["elapsed_s"] = time.time() - started_at
        R["targets"] = ts = targets(R)
        R["failures"] = failures
        table = markdown_table(result_rows(R))
        ttable = targets_table(ts)
        fl = R["fsync"]
        head = [
            "# Plant Store benchmark",
            "",
            "Figures from one run of `bench/run`. **Never compare them with another run's**: the "
            "disk and the machine change from day to day; every ratio below is within this run.",
            "",
            f"- machine: {m['nproc']} cores, {m['cpu_model']}, kernel {m['kernel']}, "
            f"{fmt(m['mem_gib'], 1)} GiB; PostgreSQL {m.get('postgres', '?')}",
            f"- date: {m['date']}; commit {m['commit']}",
            f"- disk: **{fl['fsyncs_per_s']:,.0f} fsyncs/s, {fl['ms_per_fsync']:.3f} ms per fsync** "
            f"(4 KiB pwrite+fsync for {fl['seconds']:.1f} s on {fl['filesystem']}, beside the "
            "SQLite database)",
            f"- {seconds} s per run; wrk -t1 (1 connection) / -t2, --timeout 10s; rows seeded: "
            f"SQLite {rows['sqlite']:,}, PostgreSQL {rows['postgres']:,}; every deleting run "
            f"has its own {span:,} ids",
            f"- total time {R['elapsed_s'] / 60:.1f} min",
            "",
        ]
        checks = ["## Checks against the database (hit runs and raw anchors)", ""]
        for b in BACKENDS:
            for conns in CONNS:
                checks.append(f"- {b} hits c={conns}: "
                              f"{describe_hits_check(R['service'][b]['hits'][str(conns)]['check'])}")
        checks.append(f"- sqlite-raw: {describe_blocks_check(R['anchors']['sqlite-raw']['check'])}")
        for conns in CONNS:
            checks.append(f"- pgbench c={conns}: "
                          f"{describe_blocks_check(R['anchors']['pgbench'][str(conns)]['check'])}")
        md = "\n".join(head + ["## Results", "", table, "",
                               "Ratio: req/s over the anchor's req/s. Anchor of hits: the raw "
                               "database delete (pgbench at the same client count; sqlite-raw, one "
                               "writer, for every SQLite row). Anchor of misses and 401s: nginx "
                               "at the same connection count.", "",
                               "## Targets", "", ttable, ""] + checks) + "\n"

        log("\n" + table + "\n")
        log(ttable + "\n")
        (out_dir / "results.md").write_text(md)
        (out_dir / "results.json").write_text(json.dumps(R, indent=2, default=str) + "\n")
        svg = chart_svg(R)
        (out_dir / "chart.svg").write_text(svg)
        if out_dir != BENCH:
            (BENCH / "chart.svg").write_text(svg)
        log(f"wrote {out_dir}/results.md, results.json, chart.svg; copied chart.svg to "
            f"{BENCH / 'chart.svg'} ({R['elapsed_s'] / 60:.1f} min)")
        if failures:
            log("\nFAIL: " + "\n      ".join(failures))
            return 1
        log("all checks OK")
        return 0
    except (KeyboardInterrupt, Interrupted) as e:
        log(f"\nbench: interrupted ({str(e) or 'SIGINT'}); cleaning up")
        return 130
    except (RuntimeError, subprocess.TimeoutExpired, OSError) as e:
        log(f"\nbench: error: {e}\n(logs in {work})")
        return 2
    finally:
        for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        PROCS.stop_all()
        try:
            pg.drop()
        except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
            log(f"bench: could not drop database {pg_db}: {e}")
        if not keep:
            sq.remove()


if __name__ == "__main__":
    sys.exit(main())

"""The databases: PostgreSQL and SQLite access, and their raw anchors (pgbench, sqlite-raw)."""

from __future__ import annotations

import glob
import json
import re
import shutil
import sqlite3
from pathlib import Path

from toolkit.common import psql
from toolkit.processes import run

from .checks import verify_blocks
from .common import percentile


class Postgres:
    def __init__(self, admin_url: str, db: str):
        self.admin_url = admin_url
        self.db = db
        base, _, _ = admin_url.partition("?")
        self.url = base.rsplit("/", 1)[0] + "/" + db
        self.created = False

    def psql(self, *sql: str, url: str | None = None) -> str:
        return psql(url or self.url, *sql).strip()

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


def count_range(db, lo: int, hi: int) -> int:
    return db.scalar(f"SELECT count(*) FROM plants WHERE id >= {lo} AND id < {hi}")


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

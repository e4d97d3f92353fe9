"""CPU time during a run, as shares of the whole machine (all cores): idle, and what chosen
processes and threads of them used. Read from /proc before and after the load."""

from __future__ import annotations

import os
from pathlib import Path


def _ticks(stat: str) -> int:
    # utime and stime: the 12th and 13th fields after the parenthesised command name.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _process(pid: int) -> int:
    stat = _read(Path(f"/proc/{pid}/stat"))
    return _ticks(stat) if stat else 0


def _threads(pid: int) -> dict[str, int]:
    """CPU ticks of a process's threads, summed by thread name."""
    out: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").glob("*"):
        stat = _read(task / "stat")
        if stat:
            name = stat.split("(", 1)[1].rsplit(")", 1)[0]
            out[name] = out.get(name, 0) + _ticks(stat)
    return out


def _children(pid: int) -> list[int]:
    return [int(c) for c in _read(Path(f"/proc/{pid}/task/{pid}/children")).split()]


def snapshot(service: int | None = None, receiver: int | None = None) -> dict:
    """The machine's busy and idle ticks; the service's ticks by thread name; the receiver's
    (nginx: its master and workers)."""
    cpu = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    snap = {"total": sum(cpu), "idle": cpu[3] + cpu[4], "service": {}, "receiver": 0}
    if service:
        snap["service"] = _threads(service)
    if receiver:
        snap["receiver"] = _process(receiver) + sum(_process(c) for c in _children(receiver))
    return snap


def shares(before: dict, after: dict) -> dict:
    """Percent of the machine's CPU between two snapshots: idle, the service, the
    receiver."""
    total = after["total"] - before["total"]
    if total <= 0:
        return {}
    pct = lambda ticks: 100.0 * ticks / total  # noqa: E731
    threads = {n: t - before["service"].get(n, 0) for n, t in after["service"].items()}
    return {
        "idle_pct": pct(after["idle"] - before["idle"]),
        "service_pct": pct(sum(threads.values())),
        "service_s": sum(threads.values()) / os.sysconf("SC_CLK_TCK"),
        "receiver_pct": pct(after["receiver"] - before["receiver"]),
        "cores": os.cpu_count(),
    }

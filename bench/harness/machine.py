"""The machine the run is on: cores, kernel, CPU, memory, commit, and the disk's fsync rate now."""

from __future__ import annotations

import datetime
import os
import time
from pathlib import Path

from toolkit.processes import run

from .common import ROOT, percentile


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

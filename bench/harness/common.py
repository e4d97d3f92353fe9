"""What the whole harness shares: paths, the run's shape, logging, number formats, signals
(what the deploy tests share with it is tests/toolkit/)."""

from __future__ import annotations

import math
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"

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
READYZ_STARTS = 5


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

"""The guard of a change (`bench/run --guard REV`): the service built from the checkout beside
the one built from REV, in this one run, on the same databases, alternated PAIRS times: hits
and 401s at 64 connections on both backends, each run's peak RSS; then hits with one
destination of each kind, REV's build and the checkout's in turn (main.py's webhook_pairs),
beside hits without. A pair's ratio swung by a third between runs of one build minutes
apart, so each target is judged on the median of the pairs' ratios, and every pair is
printed."""

from __future__ import annotations

import statistics
from pathlib import Path

from .checks import describe_hits_check, verify_hits
from .builds import Build
from .common import BACKEND_NAME, NOAUTH_FIRST, fmt, fmt_rate, log
from .databases import count_range
from .load import fmt_unexpected, service_under_wrk
from .webhooks import PAIRS

CONNS = 64
WORKLOADS = ("hits", "401s")
# The change's limits beside REV: hits and 401s within 10 %, and peak RSS.
WITHIN = 0.10
RSS_LIMIT_MIB = 30.0


def guard_runs(b, baseline: Build, backend: str, url: str, db) -> None:
    """PAIRS times: REV's build, then the checkout's, each a hit run and a 401 run."""
    runs = b.R.setdefault("guard", {}).setdefault(backend, {})
    for pair in range(PAIRS):
        for build, plantstore in (("before", baseline), ("after", b.checkout)):
            for workload in WORKLOADS:
                d = one_run(b, plantstore, backend, url, db, workload, pair, build)
                runs.setdefault(workload, {}).setdefault(build, []).append(d)


def one_run(b, plantstore: Build, backend: str, url: str, db, workload: str, pair: int,
            build: str) -> dict:
    """A fresh service process (so its peak RSS is this run's) under wrk at 64 connections;
    a hit run's deletes are then checked in the database."""
    db.settle(vacuum=workload == "hits")
    if workload == "hits":
        lo, hi = b.plan.guard[backend][2 * pair + (build == "after")]
        before = count_range(db, lo, hi)
    else:
        lo, hi = NOAUTH_FIRST, 0
    tag = f"guard-{backend}-{workload}-{build}-{pair + 1}"
    d = service_under_wrk(plantstore, url, b.work, workload, CONNS, lo, hi, b.s.seconds,
                          b.tokens[backend], tag, b.s.keep)
    log(f"{backend:<8} {workload:<5} {build:<6} {pair + 1} of {PAIRS} c={CONNS} "
        f"{fmt_rate(d['rps']):>9} req/s  p99 {fmt(d['p99_ms'], 3)} ms  "
        f"peak RSS {fmt(d['peak_rss_mib'], 1)} MiB  unexpected: {fmt_unexpected(d['unexpected'])}")
    if workload == "hits":
        d["check"] = v = verify_hits(db, lo, hi, before, d)
        b.note_check(tag, v, describe_hits_check)
    return d


def guard_targets(R: dict) -> list[dict]:
    """Each backend's hits and 401s after beside before (the median of the pairs' ratios),
    the highest peak RSS of the checkout's runs, and the deletion events' three targets on
    their median pair."""
    out = []
    for backend, runs in R.get("guard", {}).items():
        name = BACKEND_NAME[backend]
        for workload, builds in runs.items():
            out.append(ratio_target(f"{name} {workload} c={CONNS}: after / before", builds,
                                    WITHIN))
        out.append(rss_target(f"{name}: peak RSS", runs, "after"))
    return out


def ratio_target(what: str, builds: dict, within: float) -> dict:
    """The median pair's after / before req/s within `within` of 1, each pair shown."""
    ratio, ratios = median_ratio(builds)
    return target(f"{what} within {within:.0%} (pairs {', '.join(fmt(r) for r in ratios)})",
                  ratio, lambda r: abs(r - 1) <= within)


def rss_target(what: str, runs: dict, build: str) -> dict:
    """`build`'s highest peak RSS within the limit."""
    return target(f"{what} at c={CONNS} ≤ {RSS_LIMIT_MIB:g} MiB", peak_rss(runs, build),
                  lambda p: p <= RSS_LIMIT_MIB)


def median_ratio(builds: dict) -> tuple[float | None, list[float]]:
    """Each pair's after / before req/s, and their median."""
    ratios = [a["rps"] / b["rps"] for b, a in zip(builds["before"], builds["after"]) if b["rps"]]
    return (statistics.median(ratios) if ratios else None), ratios


def peak_rss(runs: dict, build: str) -> float:
    """The highest peak RSS of `build`'s runs without a destination."""
    return max(d["peak_rss_mib"] or 0 for workload in WORKLOADS for d in runs[workload][build])


# `--profiles`: the lighter release profile is taken if hits stay within 5 % and peak RSS
# within the limit.
PROFILE_WITHIN = 0.05


def profile_builds(tsv: Path) -> list[dict]:
    """Each build of `bench/run --profiles`: its LTO, which build it was, seconds, bytes."""
    rows = [line.split("\t") for line in tsv.read_text().splitlines() if line]
    return [{"lto": lto, "build": int(n), "seconds": int(secs), "bytes": int(size)}
            for lto, n, secs, size in rows]


def builds_table(builds: list[dict]) -> str:
    rows = ["| profile | build | seconds, from nothing | binary, bytes |", "|---|---|---|---|"]
    rows += [f"| lto={d['lto']} | {d['build']} | {d['seconds']} | {d['bytes']:,} |"
             for d in builds]
    return "\n".join(rows)


def profile_targets(R: dict) -> list[dict]:
    """Hits after (thin) beside before (fat) within 5 % on the median pair, and each
    build's peak RSS, per backend."""
    out = []
    for backend, runs in R.get("guard", {}).items():
        name = BACKEND_NAME[backend]
        out.append(ratio_target(f"{name} hits c={CONNS}: thin / fat", runs["hits"],
                                PROFILE_WITHIN))
        for build, label in (("before", "fat"), ("after", "thin")):
            out.append(rss_target(f"{name}: {label}'s peak RSS", runs, build))
    return out


def target(what: str, value, passes) -> dict:
    passed = value is not None and passes(value)
    return {"target": what, "value": value, "result": "PASS" if passed else "MISS"}


def guard_table(R: dict) -> str:
    rows = ["| backend | workload | before, req/s (each pair) | after, req/s (each pair) | "
            "peak RSS before / after, MiB |", "|---|---|---|---|---|"]
    for backend, runs in R.get("guard", {}).items():
        for workload, builds in runs.items():
            def each(build):
                return ", ".join(fmt_rate(d["rps"]) for d in builds[build])

            def rss(build):
                return fmt(max(d["peak_rss_mib"] or 0 for d in builds[build]), 1)
            rows.append(f"| {BACKEND_NAME[backend]} | {workload} | {each('before')} | "
                        f"{each('after')} | {rss('before')} / {rss('after')} |")
    return "\n".join(rows)

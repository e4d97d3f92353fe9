"""Deletion events under load: hits at 64 connections with one webhook endpoint (an nginx
`return 204` that logs when each event arrived), beside the same run without one; the events
per second and the lag from each delete's commit to its receipt."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

from . import cpu
from .checks import describe_hits_check, verify_hits
from .common import fmt, fmt_rate, free_port, log, percentile
from .databases import count_range
from .load import run_wrk, start_nginx, unexpected
from .procs import PROCS
from .service import wait_ready

CONNS = 64
DRAIN_S = 120
# Hit runs without and with an endpoint, alternated this many times per backend.
PAIRS = 3

def start_receiver(work: Path, name: str):
    """The anchor's nginx, logging when each POST arrived and its webhook-id. The log is
    written in 256 KiB blocks: a write per request would be the receiver's cost, not the
    service's, and `$msec` is taken when the request ends whenever the line is written."""
    rdir = work / f"receiver-{name}"
    access = (f"log_format hook '$msec $http_webhook_id'; "
              f"access_log {rdir}/access.log hook buffer=256k flush=1s;")
    proc, port = start_nginx(rdir, access)
    return proc, port, rdir / "access.log"


def commit_times(db, lo: int, hi: int) -> dict[str, float]:
    """webhook-id -> the entry's deleted_at in unix seconds, for the plants in [lo, hi)."""
    where = f"plant_id >= {lo} AND plant_id < {hi}"
    if hasattr(db, "psql"):
        out = db.psql(f"SELECT id, extract(epoch FROM deleted_at) FROM plantstore_deletions "
                      f"WHERE {where}")
        rows = [line.split("|") for line in out.splitlines() if line]
    else:
        con = sqlite3.connect(db.path, timeout=30)
        try:
            rows = con.execute("SELECT id, (julianday(deleted_at) - 2440587.5) * 86400.0 "
                               f"FROM plantstore_deletions WHERE {where}").fetchall()
        finally:
            con.close()
    return {f"deletion_{int(i)}": float(t) for i, t in rows}


def pending(b, url: str) -> int:
    listed = json.loads(b.svc.cli(url, "webhooks", "list", "--json"))
    return sum(e["pending"] for e in listed)


def webhook_run(b, backend: str, url: str, db, pair: int) -> None:
    """Hits at c=64 with one endpoint; the service runs until the endpoint has every event.
    `pair`: which of the backend's PAIRS runs this is; its hit run without an endpoint has
    just been made."""
    db.settle(vacuum=True)
    lo, hi = b.plan.hooked[backend][pair]
    before = count_range(db, lo, hi)
    receiver, rport, access = start_receiver(b.work, f"{backend}-{pair + 1}")
    added = b.svc.cli(url, "webhooks", "add", f"http://127.0.0.1:{rport}/hooks")
    endpoint = added.split()[3]
    port = free_port()
    slog = b.work / f"service-{backend}-hits-webhook-{CONNS}-{pair + 1}.log"
    proc = b.svc.start(url, port, slog)
    wait_ready(proc, port, "/readyz", 200, slog, 120, time.perf_counter())
    cpu_before = cpu.snapshot(proc.pid, receiver.pid)
    d = run_wrk(port, "hit", CONNS, lo, hi, b.s.seconds, b.tokens[backend],
                b.work / f"wrk-{backend}-hits-webhook-{CONNS}-{pair + 1}.out")
    d["cpu"] = cpu.shares(cpu_before, cpu.snapshot(proc.pid, receiver.pid))
    ended = time.time()
    while pending(b, url) > 0 and time.time() - ended < DRAIN_S:
        time.sleep(0.2)
    d["drain_s"] = time.time() - ended
    d["left_pending"] = pending(b, url)
    PROCS.stop(proc)
    PROCS.stop(receiver)
    b.svc.cli(url, "webhooks", "remove", endpoint)
    d["unexpected"] = unexpected(d, "204")
    committed = commit_times(db, lo, hi)
    received: dict[str, float] = {}
    for line in access.read_text().splitlines():
        at, _, hook = line.partition(" ")
        if hook in committed and hook not in received:
            received[hook] = float(at)
    lags = sorted(received[h] - committed[h] for h in received)
    times = sorted(received.values())
    d["events"] = len(committed)
    d["received"] = len(received)
    d["events_per_s"] = len(times) / (times[-1] - times[0]) if len(times) > 1 else None
    d["lag_p50_s"] = percentile(lags, 50)
    d["lag_p99_s"] = percentile(lags, 99)
    plain = without(b.R, backend)["rps"]
    d["vs_without"] = d["rps"] / plain if plain else None
    b.R.setdefault("webhook_pairs", {}).setdefault(backend, []).append(
        {"without": without(b.R, backend), "with": d})
    log(f"{backend:<8} hits+webhook {pair + 1} of {PAIRS} c={CONNS} {fmt_rate(d['rps']):>9} req/s "
        f"({fmt(d['vs_without'])} of hits without one)  {fmt_rate(d['events_per_s'])} events/s  "
        f"lag p50 {fmt(d['lag_p50_s'], 3)} s  p99 {fmt(d['lag_p99_s'], 3)} s  "
        f"received {d['received']:,} of {d['events']:,}  drained {d['drain_s']:.1f} s after wrk")
    c, c0 = d["cpu"], without(b.R, backend).get("cpu", {})
    if c:
        log(f"  CPU, % of the machine during wrk: idle {fmt(c['idle_pct'], 1)} (without an endpoint "
            f"{fmt(c0.get('idle_pct'), 1)}), service {fmt(c['service_pct'], 1)} (without "
            f"{fmt(c0.get('service_pct'), 1)}), of it the sending thread "
            f"{fmt(c['posting_pct'], 1)}; receiver {fmt(c['receiver_pct'], 1)}")
    d["check"] = v = verify_hits(db, lo, hi, before, d)
    b.note_check(f"{backend} hits+webhook {pair + 1} c={CONNS}", v, describe_hits_check)
    if d["received"] != d["events"]:
        b.failures.append(f"{backend} hits+webhook {pair + 1}: {d['events'] - d['received']} "
                          "events never reached the receiver")


def pick_median_pair(R: dict, backend: str) -> None:
    """Reports the backend's pair whose ratio is the median (the worse of the middle two for
    an even count), with every pair's ratio beside it."""
    pairs = R["webhook_pairs"][backend]
    ranked = sorted(pairs, key=lambda p: p["with"]["vs_without"] or 0.0)
    median = ranked[(len(ranked) - 1) // 2]
    R["beside"][backend] = median["without"]
    ratios = [p["with"]["vs_without"] for p in pairs]
    R.setdefault("webhooks", {})[backend] = dict(median["with"], pair_ratios=ratios)
    log(f"{backend:<8} hits+webhook: ratio of each pair "
        f"{', '.join(fmt(r) for r in ratios)}; median "
        f"{fmt(median['with']['vs_without'])}")


def without(R: dict, backend: str) -> dict:
    """The hit run at 64 connections the webhook run is compared with: the one just before
    it (the machine's speed drifts over minutes), else the backend's own."""
    return R.get("beside", {}).get(backend) or R["service"][backend]["hits"][str(CONNS)]


def ceiling(R: dict, plain: float | None) -> float | None:
    """The ratio one HTTP exchange per event would leave: were each event as cheap as one
    `wrk` request to the nginx anchor (c=64), and both runs CPU-bound, hits would keep
    1 / (1 + hits/s without an endpoint / nginx req/s) of their rate. An estimate, not a
    bound: CPU the hit run leaves idle could take cheap enough delivery for free."""
    anchor = R["anchors"]["nginx"].get(str(CONNS), {}).get("rps")
    return 1 / (1 + plain / anchor) if plain and anchor else None


def webhook_table(R: dict) -> str:
    rows = ["| backend | hits c=64 just before, without an endpoint | with one | ratio (median pair) | "
            "each pair | ceiling | events/s | lag p50 | lag p99 | received | "
            "CPU idle without / with | sending thread | receiver |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for backend, d in R.get("webhooks", {}).items():
        plain = without(R, backend)["rps"]
        c, c0 = d.get("cpu", {}), without(R, backend).get("cpu", {})
        rows.append(f"| {backend} | {fmt_rate(plain)} | {fmt_rate(d['rps'])} | "
                    f"{fmt(d['vs_without'])} | "
                    f"{', '.join(fmt(r) for r in d['pair_ratios'])} | "
                    f"{fmt(ceiling(R, plain))} | "
                    f"{fmt_rate(d['events_per_s'])} | "
                    f"{fmt(d['lag_p50_s'], 3)} s | {fmt(d['lag_p99_s'], 3)} s | "
                    f"{d['received']:,} of {d['events']:,} | "
                    f"{pct(c0.get('idle_pct'))} / {pct(c.get('idle_pct'))} | "
                    f"{pct(c.get('posting_pct'))} | {pct(c.get('receiver_pct'))} |")
    return "\n".join(rows)


def pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.1f} %"

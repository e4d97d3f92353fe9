"""Deletion events under load: hits at 64 connections with one destination (a webhook
endpoint, an nginx `return 204` that logs when each event arrived, over http and over https
with HTTP/2 by ALPN; or a NATS JetStream stream, its messages read back with their store
times), beside the same run without one; the events per second, the lag from each delete's
commit to its receipt, how soon delivery drains after the load stops, and the service's own
CPU per delete with and without the destination."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import time
from pathlib import Path

import nats
from nats.js.api import StorageType

from toolkit.common import free_port
from toolkit.processes import PROCS

from . import cpu
from .builds import Build
from .checks import describe_hits_check, verify_hits
from .common import fmt, fmt_rate, log, percentile
from .databases import count_range
from .load import run_wrk, start_nginx, unexpected

CONNS = 64
DRAIN_S = 120
# Hit runs without and with an endpoint, alternated this many times per backend.
PAIRS = 3
# The receiver over http (HTTP/1.1, a connection per request in flight) and over https
# (HTTP/2 chosen by ALPN, requests as streams of one connection); and a JetStream stream
# (`plantstore streams`) on a nats-server of the run's own, storing in files.
RECEIVERS = ("http", "https", "nats")
STREAM = "PLANTS"
# The guard on deletion events: delivery keeps up, costs the service at most 200 µs of CPU
# per event (its CPU per delete with the endpoint less that without; Svix's server, built and
# measured on these cores, spent about 2 ms), and hits keep 0.6 of their rate.
DRAIN_TARGET_S = 2.0
CPU_PER_EVENT_TARGET_US = 200.0
HITS_RATIO_TARGET = 0.6

def start_receiver(work: Path, name: str, tls: bool):
    """The anchor's nginx, logging when each POST arrived, its webhook-id and protocol. The
    log is written in 256 KiB blocks: a write per request would be the receiver's cost, not
    the service's, and `$msec` is taken when the request ends whenever the line is written."""
    rdir = work / f"receiver-{name}"
    access = (f"log_format hook '$msec $http_webhook_id $server_protocol'; "
              f"access_log {rdir}/access.log hook buffer=256k flush=1s;")
    proc, port = start_nginx(rdir, access, tls=tls)
    return proc, port, rdir


def start_broker(work: Path, name: str):
    """A `nats-server -js` on a free port, storing in files in its own folder, with the
    stream PLANTS on plantstore.plants.>, made as docs/deletion-events.md tells a user to;
    the process and its URL."""
    bdir = work / f"broker-{name}"
    bdir.mkdir()
    port = free_port()
    with open(bdir / "stderr.log", "wb") as err:
        proc = PROCS.start(["nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", bdir],
                           stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    url = f"nats://127.0.0.1:{port}"
    asyncio.run(add_stream(url))
    return proc, url


async def add_stream(url: str) -> None:
    async def quiet(_error):
        pass  # refused while the server starts: expected
    for _ in range(300):
        try:
            nc = await nats.connect(url, connect_timeout=1, allow_reconnect=False,
                                    error_cb=quiet)
            break
        except Exception:  # noqa: BLE001 - not up yet
            await asyncio.sleep(0.1)
    else:
        raise RuntimeError(f"nats-server on {url} never answered")
    await nc.jetstream().add_stream(name=STREAM, subjects=["plantstore.plants.>"],
                                    storage=StorageType.FILE)
    await nc.close()


def stored_times(url: str) -> tuple[dict[str, float], int]:
    """Nats-Msg-Id -> when JetStream stored it (unix seconds), read back by a consumer;
    and how many messages there were."""
    async def read():
        nc = await nats.connect(url)
        sub = await nc.jetstream().pull_subscribe("plantstore.plants.>", durable="bench",
                                                  stream=STREAM)
        times, count = {}, 0
        while True:
            try:
                messages = await sub.fetch(1000, timeout=2)
            # nats-py's fetch may time out as its own TimeoutError or as asyncio's,
            # of which its own is a subclass.
            except asyncio.TimeoutError:
                break
            for msg in messages:
                count += 1
                times.setdefault(msg.headers["Nats-Msg-Id"], msg.metadata.timestamp.timestamp())
                await msg.ack()
        await nc.close()
        return times, count
    return asyncio.run(read())


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


def pending(plantstore: Build, url: str, group: str) -> int:
    listed = json.loads(plantstore.cli(url, group, "list", "--json"))
    return sum(e["pending"] for e in listed)


def webhook_run(b, backend: str, url: str, db, pair: int, scheme: str,
                plantstore: Build | None = None, ids: tuple[int, int] | None = None) -> dict:
    """Hits at c=64 with one endpoint; the service runs until the endpoint has every event.
    `pair`: which of the backend's PAIRS runs this is; its hit run without an endpoint has
    just been made. `scheme`: one of RECEIVERS. `plantstore` and `ids`: another build, and
    its own id range (`--standby`, `--guard`), instead of this checkout's and the plan's;
    only this checkout's runs make the pairs `pick_median_pair` reports."""
    plantstore = plantstore or b.checkout
    db.settle(vacuum=True)
    lo, hi = ids or b.plan.hooked[backend][scheme][pair]
    before = count_range(db, lo, hi)
    tls = scheme == "https"
    tag = f"{scheme}-{pair + 1}" + ("" if plantstore is b.checkout
                                    else f"-{plantstore.binary.name}")
    group = "streams" if scheme == "nats" else "webhooks"
    settings = {}
    if scheme == "nats":
        receiver, broker = start_broker(b.work, f"{backend}-{tag}")
        added = plantstore.cli(url, "streams", "add", broker, "--stream", STREAM)
    else:
        receiver, rport, rdir = start_receiver(b.work, f"{backend}-{tag}", tls)
        host = "localhost" if tls else "127.0.0.1"
        added = plantstore.cli(url, "webhooks", "add", f"{scheme}://{host}:{rport}/hooks")
        if tls:
            settings["SSL_CERT_FILE"] = str(rdir / "ca.pem")
    endpoint = added.split()[3]
    service = plantstore.start(f"service-{backend}-hits-webhook-{CONNS}-{tag}", url, 120,
                               **settings)
    pids = (service.process.pid, receiver.pid)
    cpu_before = cpu.snapshot(*pids)
    d = run_wrk(service.port, "hit", CONNS, lo, hi, b.s.seconds, b.tokens[backend],
                b.work / f"wrk-{backend}-hits-webhook-{CONNS}-{tag}.out")
    d["cpu"] = cpu.shares(cpu_before, cpu.snapshot(*pids))
    ended = time.time()
    while pending(plantstore, url, group) > 0 and time.time() - ended < DRAIN_S:
        time.sleep(0.05)
    d["drain_s"] = time.time() - ended
    # The service's CPU for this run's deletes, their events included: from before wrk
    # until the last event was delivered.
    d["cpu_drained"] = cpu.shares(cpu_before, cpu.snapshot(*pids))
    d["left_pending"] = pending(plantstore, url, group)
    d["peak_rss_mib"] = service.peak_rss_mib()
    service.stop()
    committed = commit_times(db, lo, hi)
    received: dict[str, float] = {}
    protocols: dict[str, int] = {}
    if scheme == "nats":
        stored, messages = stored_times(broker)
        PROCS.stop(receiver)
        received = {h: at for h, at in stored.items() if h in committed}
        protocols = {"JetStream messages": messages, "distinct ids": len(stored)}
        if messages != len(stored):
            b.failures.append(f"{backend} hits+stream {pair + 1}: {messages - len(stored)} "
                              "messages repeated in the stream")
    else:
        # Stopped first: nginx writes the rest of its buffered log as it ends.
        PROCS.stop(receiver)
        for line in (rdir / "access.log").read_text().splitlines():
            at, hook, protocol = (line.split(" ") + ["", ""])[:3]
            protocols[protocol] = protocols.get(protocol, 0) + 1
            if hook in committed and hook not in received:
                received[hook] = float(at)
    plantstore.cli(url, group, "remove", endpoint)
    d["unexpected"] = unexpected(d, "204")
    d["protocols"] = protocols
    lags = sorted(received[h] - committed[h] for h in received)
    times = sorted(received.values())
    d["events"] = len(committed)
    d["received"] = len(received)
    d["events_per_s"] = len(times) / (times[-1] - times[0]) if len(times) > 1 else None
    d["lag_p50_s"] = percentile(lags, 50)
    d["lag_p99_s"] = percentile(lags, 99)
    plain = without(b.R, backend)
    d["vs_without"] = d["rps"] / plain["rps"] if plain["rps"] else None
    d["without_rps"] = plain["rps"]
    d["without_idle_pct"] = plain.get("cpu", {}).get("idle_pct")
    d["cpu_per_delete_us"] = cpu_per_delete_us(d, d["cpu_drained"])
    d["without_cpu_per_delete_us"] = cpu_per_delete_us(plain, plain.get("cpu", {}))
    d["cpu_ratio"] = (d["cpu_per_delete_us"] / d["without_cpu_per_delete_us"]
                      if d["cpu_per_delete_us"] and d["without_cpu_per_delete_us"] else None)
    d["cpu_per_event_us"] = (d["cpu_per_delete_us"] - d["without_cpu_per_delete_us"]
                             if d["cpu_per_delete_us"] and d["without_cpu_per_delete_us"]
                             else None)
    if plantstore is b.checkout:
        b.R.setdefault("webhook_pairs", {}).setdefault(key(backend, scheme), []).append(
            {"without": plain, "with": d})
    build = "" if plantstore is b.checkout else f" ({plantstore.binary})"
    log(f"{backend:<8} hits+webhook {scheme}{build} {pair + 1} of {PAIRS} c={CONNS} "
        f"{fmt_rate(d['rps']):>9} req/s ({fmt(d['vs_without'])} of hits without one)  "
        f"CPU/delete {fmt(d['cpu_per_delete_us'], 1)} µs ({fmt(d['cpu_ratio'])} of "
        f"{fmt(d['without_cpu_per_delete_us'], 1)} µs without)  "
        f"{fmt_rate(d['events_per_s'])} events/s  "
        f"lag p50 {fmt(d['lag_p50_s'], 3)} s  p99 {fmt(d['lag_p99_s'], 3)} s  "
        f"received {d['received']:,} of {d['events']:,}  drained {d['drain_s']:.2f} s after wrk"
        f"  receiver saw {protocols}")
    c, c0 = d["cpu"], without(b.R, backend).get("cpu", {})
    if c:
        log(f"  CPU, % of the machine during wrk: idle {fmt(c['idle_pct'], 1)} (without an endpoint "
            f"{fmt(c0.get('idle_pct'), 1)}), service {fmt(c['service_pct'], 1)} (without "
            f"{fmt(c0.get('service_pct'), 1)}); receiver {fmt(c['receiver_pct'], 1)}")
    d["check"] = v = verify_hits(db, lo, hi, before, d)
    b.note_check(f"{backend} hits+webhook {pair + 1} c={CONNS}", v, describe_hits_check)
    if d["received"] != d["events"]:
        b.failures.append(f"{backend} hits+webhook {pair + 1}: {d['events'] - d['received']} "
                          "events never reached the receiver")
    return d


def key(backend: str, scheme: str) -> str:
    return f"{backend} {scheme}"


def cpu_per_delete_us(d: dict, shares: dict) -> float | None:
    """The service's CPU microseconds per delete answered 204."""
    deletes = d.get("statuses", {}).get("204", 0)
    return shares["service_s"] * 1e6 / deletes if deletes and "service_s" in shares else None


def pick_median_pair(R: dict, backend: str) -> None:
    """Reports, for each receiver, the backend's pair whose hit ratio is the median (the worse
    of the middle two for an even count), with every pair's ratios beside it."""
    for scheme in RECEIVERS:
        pairs = R["webhook_pairs"][key(backend, scheme)]
        ranked = sorted(pairs, key=lambda p: p["with"]["vs_without"] or 0.0)
        median = ranked[(len(ranked) - 1) // 2]
        ratios = [p["with"]["vs_without"] for p in pairs]
        cpu_ratios = [p["with"]["cpu_ratio"] for p in pairs]
        R.setdefault("webhooks", {})[key(backend, scheme)] = dict(
            median["with"], pair_ratios=ratios, pair_cpu_ratios=cpu_ratios)
        log(f"{backend:<8} hits+webhook {scheme}: hit ratio of each pair "
            f"{', '.join(fmt(r) for r in ratios)} (median {fmt(median['with']['vs_without'])}); "
            f"CPU per delete ratio {', '.join(fmt(r) for r in cpu_ratios)}")


def without(R: dict, backend: str) -> dict:
    """The hit run at 64 connections the webhook run is compared with: the one just before
    it (the machine's speed drifts over minutes), else the backend's own."""
    return R.get("beside", {}).get(backend) or R["service"][backend]["hits"][str(CONNS)]


def webhook_table(R: dict) -> str:
    rows = ["| backend, receiver | hits c=64 just before, without an endpoint | with one | "
            "hit ratio (median pair) | each pair | CPU/delete without | with | CPU ratio | "
            "each pair | drained after wrk | events/s | lag p50 | lag p99 | received | "
            "CPU idle without / with | receiver |",
            "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for name, d in R.get("webhooks", {}).items():
        c = d.get("cpu", {})
        rows.append(f"| {name} | {fmt_rate(d['without_rps'])} | {fmt_rate(d['rps'])} | "
                    f"{fmt(d['vs_without'])} | "
                    f"{', '.join(fmt(r) for r in d['pair_ratios'])} | "
                    f"{fmt(d['without_cpu_per_delete_us'], 1)} µs | "
                    f"{fmt(d['cpu_per_delete_us'], 1)} µs | {fmt(d['cpu_ratio'])} | "
                    f"{', '.join(fmt(r) for r in d['pair_cpu_ratios'])} | "
                    f"{d['drain_s']:.2f} s | "
                    f"{fmt_rate(d['events_per_s'])} | "
                    f"{fmt(d['lag_p50_s'], 3)} s | {fmt(d['lag_p99_s'], 3)} s | "
                    f"{d['received']:,} of {d['events']:,} | "
                    f"{pct(d.get('without_idle_pct'))} / {pct(c.get('idle_pct'))} | "
                    f"{pct(c.get('receiver_pct'))} |")
    return "\n".join(rows)


def webhook_targets(R: dict) -> list[dict]:
    """The three targets for each backend and receiver, on its median pair."""
    out = []
    for name, d in R.get("webhooks", {}).items():
        targets = [
            (f"{name}: pending drains within {DRAIN_TARGET_S:g} s after the load stops",
             d["drain_s"], DRAIN_TARGET_S, False),
            (f"{name}: hits with the destination ≥ {HITS_RATIO_TARGET}× without",
             d["vs_without"], HITS_RATIO_TARGET, True),
        ]
        # The stream's CPU per event is reported, not held to the webhooks' target.
        if not name.endswith("nats"):
            targets.insert(1, (f"{name}: the service's CPU per event ≤ "
                               f"{CPU_PER_EVENT_TARGET_US:g} µs",
                               d["cpu_per_event_us"], CPU_PER_EVENT_TARGET_US, False))
        for target, value, limit, higher in targets:
            passed = value is not None and (value >= limit if higher else value <= limit)
            out.append({"target": target, "value": value, "limit": limit,
                        "result": "PASS" if passed else "MISS"})
    return out


def webhook_targets_table(ts: list[dict]) -> str:
    rows = ["| target | measured | result |", "|---|--:|---|"]
    rows += [f"| {t['target']} | {fmt(t['value'])} | **{t['result']}** |" for t in ts]
    return "\n".join(rows)


def pct(share: float | None) -> str:
    return "-" if share is None else f"{share:.1f} %"

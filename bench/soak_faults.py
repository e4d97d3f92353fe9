#!/usr/bin/env python3
"""The operators' hour: a soak on PostgreSQL with faults inside it, measured each minute.

Start it through `bench/soak --faults` (run as root). Two instances serve a pg_auto_failover
formation (a monitor and two nodes: tests/toolkit/pg_auto_failover.py's Cluster, which
tests/deploy/failover.py builds too) behind HAProxy, with one webhook endpoint (a receiver
process of its own that logs each request's arrival) and retention on
(PLANTSTORE_DELETION_RETENTION 15m, the idempotency TTL 10m, so pruning runs inside the
hour). CLIENTS threads delete through HAProxy, each at most RATE deletes a second, for
SOAK_SECONDS (default 3600). SOAK_FAULTS names the faults in order,
comma-separated, from `primary` (the primary's postgres killed with SIGKILL and the standby
promoted), `instance` (instance b killed with SIGKILL and started again) and `receiver` (the
receiver answers 503 for two minutes), spread evenly over the run. The default,
`instance,receiver,primary,receiver`, puts them at minutes 12, 24, 36 and 48 of the hour.
Each minute it prints hits/s, the deletes' p99, each instance's RSS and open descriptors, the
events' delivery lag (p99, arrival less the event's timestamp) and the log's size. At the end
it fails unless no answer was untrue (a 204 or 404 for a plant still there, a plant gone
that nobody asked for), every plant gone had its delete's event received, every entry still
in the log was received, and RSS and descriptors are flat after the warm-up by their slope
(RSS within 5 % of its mean per hour, descriptors within 8 per hour).

Warm-up: an instance's first WARM_UP_MIN minutes and, when a receiver outage comes after its
start, until that outage's backlog is delivered (the first minute after it whose delivery
lag p99 is under a second). The first backlog is the instance's busiest moment, and glibc
keeps the pages its peak touched (bench/JOURNAL.md, "three receiver outages in one run"), so
RSS steps once there; the second outage then shows whether each backlog adds more. The slope
is Theil-Sen's (the median of the slopes between every two minutes), so the minutes a backlog
holds more delivery connections open do not pass for a trend; the least-squares slope is
printed beside it. It writes the minute table as TSV and the chart as SVG into
bench/out/soak-faults/. Never run by CI.
"""

from __future__ import annotations

import collections
import http.client
import http.server
import json
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path

# The checkout stays as the soak found it: no __pycache__ folder appears beside the packages.
sys.dont_write_bytecode = True
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from toolkit.common import fail, free_port, get, psql, wait_until  # noqa: E402
from toolkit.pg_auto_failover import Cluster, Writability  # noqa: E402
from toolkit.service import Service, cli, prepare_database  # noqa: E402
from harness.chart import soak_faults_svg  # noqa: E402

WHAT = "soak with faults"
CLIENTS = 16
RATE = 20  # deletes a second per client at most
WARM_UP_MIN = 5
RSS_FLAT_PER_HOUR = 0.05
FDS_FLAT_PER_HOUR = 8.0
OUTAGE_S = 120
FAULTS = {"primary": "primary killed", "instance": "instance b killed",
          "receiver": "receiver outage"}
DRAIN_S = 600


# The receiver runs in a process of its own, so that the clients' threads do not slow it.
def receive(port: int, log_path: str, outage) -> None:
    log = open(log_path, "a", buffering=1 << 16)
    lock = threading.Lock()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            status = 503 if outage.value else 204
            if status == 204:
                event = json.loads(body)
                with lock:
                    log.write(f"{time.time():.3f} {self.headers.get('webhook-id')} "
                              f"{event['type']} {event['data']['plant_id']} "
                              f"{event['timestamp']}\n")
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, *_):
            pass

    class Server(http.server.ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 256

    signal.signal(signal.SIGTERM, lambda *_: (log.flush(), os._exit(0)))
    Server(("127.0.0.1", port), Handler).serve_forever()


class Load:
    """CLIENTS threads deleting plants in turn through `port`, each at most RATE a second;
    every answer kept as (wall time, seconds, status, plant)."""

    def __init__(self, port: int, token: str, plants: int):
        self.port, self.token, self.plants = port, token, plants
        self.next_plant = 0
        self.lock = threading.Lock()
        self.answers: list[tuple[float, float, object, int]] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(CLIENTS)]

    def take(self) -> int | None:
        with self.lock:
            self.next_plant += 1
            return self.next_plant if self.next_plant <= self.plants else None

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Authorization": f"Bearer {self.token}"}
        while not self.stop.is_set():
            plant = self.take()
            if plant is None:
                return
            began, wall = time.monotonic(), time.time()
            try:
                conn.request("DELETE", f"/plants/{plant}", headers=headers)
                answer = conn.getresponse()
                answer.read()
                status: object = answer.status
            except (OSError, http.client.HTTPException) as err:
                status = f"lost: {type(err).__name__}"
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
            took = time.monotonic() - began
            with self.lock:
                self.answers.append((wall, took, status, plant))
            time.sleep(max(0.0, 1 / RATE - took))
        conn.close()


def haproxy(work: str, front: int, ports: list[int]) -> subprocess.Popen:
    config = os.path.join(work, "haproxy.cfg")
    servers = "\n".join(f"    server {name} 127.0.0.1:{port} check"
                        for name, port in zip("ab", ports))
    # As tests/deploy/haproxy.cfg, for two instances.
    with open(config, "w") as out:
        out.write(f"""global
    maxconn 4096
defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    retries 3
    option redispatch
frontend plantstore
    bind 127.0.0.1:{front}
    default_backend instances
backend instances
    balance roundrobin
    option httpchk GET /readyz
    http-check expect status 200
    default-server inter 300ms fall 2 rise 2
{servers}
""")
    process = subprocess.Popen(["haproxy", "-db", "-f", config], stdout=subprocess.DEVNULL,
                               stderr=open(os.path.join(work, "haproxy.log"), "w"))
    if not wait_until(lambda: get(f"http://127.0.0.1:{front}/readyz")[0] == 200, 15):
        fail(WHAT, "HAProxy did not come up")
    return process


def log_size(uri: str) -> int | None:
    try:
        return int(psql(uri, "SELECT count(*) FROM plantstore_deletions").strip())
    except (RuntimeError, ValueError):
        return None


def received(path: Path) -> list[tuple[float, str, str, int, float]]:
    """(arrival, webhook-id, type, plant, event time) of each request the receiver took."""
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            out.append((float(parts[0]), parts[1], parts[2], int(parts[3]),
                        datetime.fromisoformat(parts[4]).timestamp()))
    return out


def percentile(values: list[float], p: float) -> float | None:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))] if values else None


def theil_sen_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Theil-Sen slope of (minute, value) points, per hour: the median of the slopes between
    every two points."""
    points = [(x, y) for x, y in points if y is not None]
    slopes = sorted(60 * (y2 - y1) / (x2 - x1) for i, (x1, y1) in enumerate(points)
                    for x2, y2 in points[i + 1:] if x2 != x1)
    if len(points) < 3 or not slopes:
        return None
    middle = len(slopes) // 2
    return slopes[middle] if len(slopes) % 2 else (slopes[middle - 1] + slopes[middle]) / 2


def least_squares_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (minute, value) points, per hour."""
    points = [(x, y) for x, y in points if y is not None]
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return 60 * sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def main() -> int:
    seconds = int(os.environ.get("SOAK_SECONDS", "3600"))
    named = os.environ.get("SOAK_FAULTS", "instance,receiver,primary,receiver").split(",")
    if set(named) - FAULTS.keys():
        print(f"SOAK_FAULTS={','.join(named)}: name faults from {', '.join(FAULTS)}",
              file=sys.stderr)
        return 2
    binary = str(ROOT / "target/release/plantstore")
    out_dir = ROOT / "bench" / "out" / "soak-faults"
    out_dir.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="plantstore-soak-faults-")
    shutil.chown(work, "postgres")
    os.chmod(work, 0o755)
    plants = CLIENTS * RATE * seconds + 10_000
    cluster = Cluster(work, WHAT)
    instances: list[Service] = []
    balancer = None
    outage = multiprocessing.Value("b", 0)
    receiver_log = Path(work) / "received.log"
    receiver_port = free_port()
    receiver = multiprocessing.Process(target=receive, args=(receiver_port, str(receiver_log),
                                                             outage), daemon=True)
    receiver.start()
    try:
        cluster.start()
        uri = cluster.uri()
        print(f"pg_auto_failover: {cluster.states()}; {plants:,} plants seeded", flush=True)
        token = prepare_database(binary, uri, plants)
        cli(binary, uri, "webhooks", "add", f"http://127.0.0.1:{receiver_port}/hooks")
        settings = dict(PLANTSTORE_DB_ACQUIRE_TIMEOUT="1s", PLANTSTORE_WEBHOOK_RETRY_MAX="5s",
                        PLANTSTORE_SHUTDOWN_DELAY="2s", PLANTSTORE_IDEMPOTENCY_TTL="10m",
                        PLANTSTORE_DELETION_RETENTION="15m", RUST_LOG="warn")
        for name in ("a", "b"):
            instance = Service(name, binary, uri, free_port(), work, **settings)
            if not instance.start():
                fail(WHAT, f"instance {name} did not get ready")
            instances.append(instance)
        front = free_port()
        balancer = haproxy(work, front, [i.port for i in instances])
        load = Load(front, token, plants)
        began = time.time()
        for thread in load.threads:
            thread.start()
        faults: list[tuple[float, str]] = []
        samples: dict[int, dict] = {}
        plan = [(seconds * (i + 1) / (len(named) + 1), FAULTS[name])
                for i, name in enumerate(named)]
        minute = 0
        while time.time() - began < seconds:
            if plan and time.time() - began >= plan[0][0]:
                at, what = plan.pop(0)
                faults.append(((time.time() - began) / 60, what))
                fault(what, cluster, instances, outage)
            next_minute = began + (minute + 1) * 60
            if time.time() >= next_minute:
                minute += 1
                row = {"minute": minute, "log_entries": log_size(uri)}
                for instance in instances:
                    row[f"rss_{instance.name}"] = instance.rss_mib()
                    row[f"fds_{instance.name}"] = instance.descriptors()
                samples[minute] = row
                print(f"minute {minute}: {row}", flush=True)
            time.sleep(0.5)
        load.stop.set()
        for thread in load.threads:
            thread.join(60)
        ended = time.time()

        def drained():
            try:
                listed = json.loads(cli(binary, uri, "webhooks", "list", "--json"))
                return sum(e["pending"] for e in listed) == 0
            except (RuntimeError, ValueError, KeyError):
                return False

        if not wait_until(drained, DRAIN_S):
            fail(WHAT, f"events still pending {DRAIN_S} s after the load")
        print(f"drained {time.time() - ended:.1f} s after the load", flush=True)
        time.sleep(2)  # the receiver's log is flushed at least every 64 KiB; stop it below
        receiver.terminate()
        receiver.join(10)
        remaining = {int(x) for x in psql(uri, "SELECT id FROM plants").split()}
        logged = psql(uri, "SELECT id, plant_id FROM plantstore_deletions").split()
        result = report(load, remaining, logged, received(receiver_log), samples, faults,
                        began, out_dir, plants)
        if result != 0:
            keep = out_dir / "work"
            shutil.rmtree(keep, ignore_errors=True)
            # The logs, not the databases' folders.
            shutil.copytree(work, keep, ignore=lambda folder, names: [
                n for n in names if folder == work and os.path.isdir(os.path.join(folder, n))])
            print(f"the run's logs and the receiver's: {keep}")
        return result
    finally:
        if receiver.is_alive():
            receiver.terminate()
        for instance in instances:
            instance.kill()
        if balancer is not None:
            balancer.terminate()
        cluster.stop()
        shutil.rmtree(work, ignore_errors=True)


def fault(what: str, cluster: Cluster, instances: list[Service], outage) -> None:
    started = time.monotonic()
    if what == "primary killed":
        primary = cluster.writable()
        if primary is None:
            fail(WHAT, f"no primary to kill: {cluster.states()}")
        writability = Writability(cluster, exclude=primary)
        writability.start()
        os.kill(cluster.postmaster_pid(primary), signal.SIGKILL)
        node, at = writability.wait(180)
        print(f"fault: {primary}'s postgres killed; {node} took writes "
              f"{at - started:.1f} s later", flush=True)
    elif what == "instance b killed":
        instances[1].kill()
        if not instances[1].start():
            fail(WHAT, "instance b did not start again")
        print(f"fault: instance b killed and ready again {time.monotonic() - started:.1f} s "
              "later", flush=True)
    else:
        outage.value = 1
        threading.Timer(OUTAGE_S, lambda: setattr(outage, "value", 0)).start()
        print(f"fault: the receiver answers 503 for {OUTAGE_S} s", flush=True)


def warm_up_end(started: float, rows: list[dict], faults: list[tuple[float, str]]
                ) -> float | None:
    """The minute an instance started at `started` is warm (see the module's comment), None
    if the backlog of the first receiver outage after its start was never delivered."""
    since = started + WARM_UP_MIN
    outage = next((at for at, what in faults if what == "receiver outage" and at > started),
                  None)
    if outage is None:
        return since
    ended = outage + OUTAGE_S / 60
    caught_up = next((r["minute"] for r in rows if r["minute"] >= ended + 1
                      and r["lag_p99_s"] is not None and r["lag_p99_s"] < 1.0), None)
    return None if caught_up is None else max(since, caught_up)


def report(load, remaining, logged, got, samples, faults, began, out_dir, plants) -> int:
    ok = True
    statuses = collections.Counter(a[2] for a in load.answers)
    asked = {a[3] for a in load.answers}
    untrue = [a for a in load.answers if a[2] in (204, 404) and a[3] in remaining]
    gone_unasked = [p for p in range(1, plants + 1) if p not in remaining and p not in asked]
    first_arrival: dict[str, tuple[float, float]] = {}
    deleted_events: dict[int, set] = collections.defaultdict(set)
    for arrival, webhook_id, kind, plant, at in got:
        first_arrival.setdefault(webhook_id, (arrival, at))
        if kind == "plant.deleted":
            deleted_events[plant].add(webhook_id)
    gone = [p for p in asked if p not in remaining]
    without_event = [p for p in gone if len(deleted_events[p]) != 1]
    logged_ids = {f"deletion_{line.split('|')[0]}" for line in logged}
    log_unreceived = sorted(logged_ids - set(first_arrival))
    print(f"\nanswers: {dict(statuses)}; {len(untrue)} untrue; {len(gone_unasked)} plants gone "
          "that nobody asked for")
    print(f"events: {len(first_arrival):,} distinct received; {len(without_event)} of "
          f"{len(gone):,} plants gone without exactly one delete event; {len(log_unreceived)} "
          f"of {len(logged_ids):,} entries still in the log never received")
    answers_of = collections.defaultdict(list)
    for _, _, status, plant in load.answers:
        answers_of[plant].append(status)
    for plant in without_event[:5]:
        print(f"  plant {plant}: delete events {sorted(deleted_events[plant])}, answers "
              f"{answers_of[plant]}")
    for answer in untrue[:5]:
        print(f"  untrue: {answer}")
    ok &= not untrue and not gone_unasked and not without_event and not log_unreceived

    by_minute = collections.defaultdict(list)
    for wall, took, status, _ in load.answers:
        by_minute[int((wall - began) // 60) + 1].append((took, status))
    lag_by_minute = collections.defaultdict(list)
    for arrival, at in first_arrival.values():
        lag_by_minute[int((arrival - began) // 60) + 1].append(arrival - at)
    rows = []
    print("\n| minute | hits/s | p99 ms | RSS a MiB | RSS b MiB | fds a | fds b | lag p99 s | "
          "log entries |\n|---|---|---|---|---|---|---|---|---|")
    for minute in sorted(samples):
        answers = by_minute.get(minute, [])
        row = dict(samples[minute])
        row["hits_s"] = sum(1 for _, s in answers if s == 204) / 60
        p99 = percentile([t for t, _ in answers], 99)
        row["p99_ms"] = p99 * 1000 if p99 is not None else None
        row["lag_p99_s"] = percentile(lag_by_minute.get(minute, []), 99)
        rows.append(row)
        cell = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        print(f"| {minute} | {row['hits_s']:.0f} | {cell(row['p99_ms'], '.1f')} | "
              f"{cell(row.get('rss_a'), '.1f')} | {cell(row.get('rss_b'), '.1f')} | "
              f"{cell(row.get('fds_a'), 'd')} | {cell(row.get('fds_b'), 'd')} | "
              f"{cell(row['lag_p99_s'], '.2f')} | {cell(row['log_entries'], ',')} |")
    print("\nfaults (minute): " + "; ".join(f"{at:.1f} {what}" for at, what in faults))
    restarted = next((at for at, what in faults if what == "instance b killed"), 0.0)
    for name, started in (("a", 0.0), ("b", restarted)):
        since = warm_up_end(started, rows, faults)
        if since is None:
            print(f"instance {name}: the backlog of its first receiver outage was never "
                  "delivered (no minute after it with a delivery lag p99 under 1 s)")
            ok = False
            continue
        rss = [(r["minute"], r.get(f"rss_{name}")) for r in rows if r["minute"] >= since]
        fds = [(r["minute"], r.get(f"fds_{name}")) for r in rows if r["minute"] >= since]
        rss_slope, fds_slope = theil_sen_per_hour(rss), theil_sen_per_hour(fds)
        if rss_slope is None or fds_slope is None:
            print(f"instance {name}: too few minutes after minute {since:.0f} to judge a slope")
            ok = False
            continue
        values = [v for _, v in rss if v is not None]
        mean = sum(values) / len(values) if values else 0
        flat_rss = abs(rss_slope) <= RSS_FLAT_PER_HOUR * mean
        flat_fds = abs(fds_slope) <= FDS_FLAT_PER_HOUR
        print(f"instance {name} from minute {since:.0f}: RSS slope {rss_slope:+.2f} MiB/h "
              f"(least squares {least_squares_per_hour(rss):+.2f}; mean {mean:.1f} MiB, limit "
              f"±{RSS_FLAT_PER_HOUR * mean:.1f}): {'flat' if flat_rss else 'NOT FLAT'}; "
              f"descriptors slope {fds_slope:+.2f}/h (least squares "
              f"{least_squares_per_hour(fds):+.2f}; limit ±{FDS_FLAT_PER_HOUR:.0f}): "
              f"{'flat' if flat_fds else 'NOT FLAT'}")
        ok &= flat_rss and flat_fds
    with open(out_dir / "minutes.tsv", "w") as tsv:
        keys = ["minute", "hits_s", "p99_ms", "rss_a", "rss_b", "fds_a", "fds_b", "lag_p99_s",
                "log_entries"]
        tsv.write("\t".join(keys) + "\n")
        for row in rows:
            tsv.write("\t".join("" if row.get(k) is None else str(row[k]) for k in keys) + "\n")
    (out_dir / "chart.svg").write_text(soak_faults_svg(rows, faults))
    print(f"\nthe minute table: {out_dir / 'minutes.tsv'}; the chart: {out_dir / 'chart.svg'}")
    print(f"soak with faults: {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What the deploy tests share beyond the toolkit: clients deleting through HTTP on
kept-alive connections, checking every answer against the database, both backends in turn,
and test hosts whose network fails on cue."""

import collections
import http.client
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid

from toolkit.common import fail, psql
from toolkit.service import cli


def psql_or_sqlite(url, sql):
    """The first column of `sql`'s rows, from PostgreSQL or a SQLite file's URL."""
    if url.startswith("sqlite:"):
        path = url.split("://", 1)[1].split("?", 1)[0]
        out = subprocess.run(["python3", "-c",
                              "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]);"
                              "print('\\n'.join(str(r[0]) for r in c.execute(sys.argv[2])))",
                              path, sql], check=True, capture_output=True, text=True)
        return out.stdout.split()
    return psql(url, sql).split()


def on_both_backends(run, work, name):
    """`run(url, label)` on a SQLite file in `work`, then on a new PostgreSQL database of
    the server PLANTSTORE_CI_POSTGRES_URL names, dropped afterwards."""
    admin = os.environ.get("PLANTSTORE_CI_POSTGRES_URL",
                           "postgres://postgres@127.0.0.1:5432/postgres")
    run(f"sqlite://{work}/{name}.db?mode=rwc", "sqlite")
    database = f"plantstore_{name.replace('-', '_')}_{uuid.uuid4().hex}"
    psql(admin, f"CREATE DATABASE {database}")
    try:
        run(f"{admin.rsplit('/', 1)[0]}/{database}", "postgres")
    finally:
        psql(admin, f"DROP DATABASE {database} WITH (FORCE)")


class Answer(collections.namedtuple("Answer", "plant status at retry_after")):
    """`status` is the HTTP status, or "lost: …" when the connection ended without an
    answer; `at` is when it came (time.monotonic())."""


class Clients:
    """`count` threads, each deleting its own plants through `port` on one kept-alive
    connection, until stopped or out of plants."""

    def __init__(self, count, port, token, plants):
        self.port, self.token, self.plants = port, token, plants
        self.answers = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i, count)) for i in range(count)]

    def run(self, first, step):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        headers = {"Authorization": f"Bearer {self.token}"}
        mine = []
        for plant in range(first + 1, self.plants + 1, step):
            if self.stop.is_set():
                break
            try:
                conn.request("DELETE", f"/plants/{plant}", headers=headers)
                answer = conn.getresponse()
                answer.read()
                mine.append(Answer(plant, answer.status, time.monotonic(),
                                   answer.getheader("retry-after")))
                if answer.getheader("connection", "").lower() == "close":
                    conn.close()
            except (OSError, http.client.HTTPException) as err:
                mine.append(Answer(plant, f"lost: {type(err).__name__}: {err}",
                                   time.monotonic(), None))
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        with self.lock:
            self.answers.extend(mine)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_):
        self.stop.set()
        for thread in self.threads:
            thread.join()

    def counts(self):
        return collections.Counter(
            a.status if isinstance(a.status, int) else "lost" for a in self.answers)


def check_database(url, answers, plants):
    """Disagreements between the answers and the database: a 204 whose plant is not gone
    and audited exactly once, a 404 for a plant still there (each plant is asked for once,
    so a 404 is right only when a retry found its own earlier delete), a plant gone but not
    audited once, or gone unasked. Also returns how many 503s were for plants that are gone
    (a commit already sent when the deadline fell may land)."""
    remaining = {int(x) for x in psql(url, "SELECT id FROM plants").split()}
    audited = collections.Counter()
    rows = psql(url, "SELECT plant_id, COUNT(*) FROM plantstore_deletions GROUP BY plant_id")
    for line in rows.split():
        plant, count = line.split("|")
        audited[int(plant)] = int(count)
    asked = {a.plant for a in answers}
    problems = []
    landed_503 = 0
    for a in answers:
        if a.status in (204, 404) and (a.plant in remaining or audited[a.plant] != 1):
            problems.append(f"plant {a.plant}: {a.status}, but gone={a.plant not in remaining}, "
                            f"audited {audited[a.plant]}x")
        if a.status == 503 and a.plant not in remaining:
            landed_503 += 1
    for plant in range(1, plants + 1):
        gone = plant not in remaining
        if gone != (audited[plant] == 1) or audited[plant] > 1:
            problems.append(f"plant {plant}: gone={gone}, audited {audited[plant]}x")
        if gone and plant not in asked:
            problems.append(f"plant {plant}: gone, though nobody asked")
    return problems, landed_503


def fail_on(what, problems, summary):
    """Fails with the first ten `problems` and a `summary` of them, if there are any."""
    if problems:
        for problem in problems[:10]:
            print(f"  {problem}", file=sys.stderr)
        fail(what, f"{len(problems)} {summary}")


def sh(*args, check=True):
    return subprocess.run(args, check=check, capture_output=True, text=True)


class TestHost:
    """A network namespace with one veth to this one: this side is `<subnet>.1`, the host
    `<subnet>.2` (`address`). nftables inside it decides what reaches it. Needs root."""

    def __init__(self, subnet):
        tag = uuid.uuid4().hex[:6]
        self.name, self.outer, self.inner = f"psr{tag}", f"psr{tag}h", f"psr{tag}n"
        self.address = f"{subnet}.2"
        sh("ip", "netns", "add", self.name)
        sh("ip", "link", "add", self.outer, "type", "veth", "peer", "name", self.inner)
        sh("ip", "link", "set", self.inner, "netns", self.name)
        sh("ip", "addr", "add", f"{subnet}.1/30", "dev", self.outer)
        sh("ip", "link", "set", self.outer, "up")
        self.run("ip", "addr", "add", f"{self.address}/30", "dev", self.inner)
        self.run("ip", "link", "set", self.inner, "up")
        self.run("ip", "link", "set", "lo", "up")
        self.run("nft", "add", "table", "inet", "plantstore_test")
        self.run("nft", "add chain inet plantstore_test input "
                        "{ type filter hook input priority 0; }")

    def run(self, *args):
        return sh("ip", "netns", "exec", self.name, *args)

    def link(self, rule):
        """Every packet arriving at the host passes `rule` (None: all pass)."""
        self.run("nft", "flush", "chain", "inet", "plantstore_test", "input")
        if rule:
            self.run("nft", f"add rule inet plantstore_test input {rule}")

    def remove(self):
        sh("ip", "netns", "del", self.name, check=False)
        sh("ip", "link", "del", self.outer, check=False)


def on_both_backends_behind_a_test_host(subnet, work, name, run):
    """`run(url, label, work, host)` on both backends (`on_both_backends`), with one TestHost
    on `subnet` made for them and removed after; `work` is a temporary folder unless given."""
    host = TestHost(subnet)
    try:
        with tempfile.TemporaryDirectory() as temporary:
            folder = work or temporary
            on_both_backends(lambda url, label: run(url, label, folder, host), folder, name)
    finally:
        host.remove()


class Deleter:
    """Deletes one plant every `every` seconds; each second one deleted plant is restored
    and deleted again. Keeps each delete's status, latency and phase (set from outside)."""

    def __init__(self, binary, url, port, token, every=0.02):
        self.binary, self.url, self.port, self.token = binary, url, port, token
        self.every = every
        self.answers = []  # (phase, status, seconds)
        self.phase = "before"
        self.stop = threading.Event()
        self.restored = []
        # A daemon, so that a scenario stopped by an error does not hang on it.
        self.thread = threading.Thread(target=self.run, daemon=True)

    def delete(self, conn, plant):
        started = time.monotonic()
        conn.request("DELETE", f"/plants/{plant}",
                     headers={"Authorization": f"Bearer {self.token}"})
        answer = conn.getresponse()
        answer.read()
        self.answers.append((self.phase, answer.status, time.monotonic() - started))

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        plant, last_restore = 0, time.monotonic()
        while not self.stop.is_set():
            plant += 1
            self.delete(conn, plant)
            if time.monotonic() - last_restore >= 1 and plant > 10:
                last_restore = time.monotonic()
                again = plant - 5
                entry = psql_or_sqlite(self.url, "SELECT id FROM plantstore_deletions "
                                                 f"WHERE plant_id = {again}")[-1]
                cli(self.binary, self.url, "deletions", "restore", entry, "--by", "test")
                self.delete(conn, again)
                self.restored.append(again)
            time.sleep(self.every)
        conn.close()

    def latency_by_phase(self):
        """{phase: (p50, p99)} of the deletes' seconds."""
        by_phase = collections.defaultdict(list)
        for phase, _, seconds in self.answers:
            by_phase[phase].append(seconds)
        return {phase: (percentile(times, 50), percentile(times, 99))
                for phase, times in by_phase.items()}


def percentile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p / 100))] if values else 0.0

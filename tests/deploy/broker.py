"""What the stream destination's deploy tests share: a `nats-server -js` of the run's own
with a stream on plantstore.plants.>, and the exactly-once check of that stream against the
deletion log. Needs a Python with nats-py (target/webhook-venv, as .ci/run makes it)."""

import asyncio
import collections
import json
import os
import subprocess
import uuid

import nats
from nats.js.api import StorageType

from toolkit.common import fail, free_port, wait_until
from fixtures import psql_or_sqlite


class Broker:
    """A `nats-server -js` storing in a new folder of `work`, listening on `address` (inside
    `host`, a fixtures.TestHost, when one is given), with a stream PLANTS on
    plantstore.plants.> for the service's stream destination."""

    STREAM = "PLANTS"

    def __init__(self, work, what, address="127.0.0.1", host=None):
        self.what = what
        self.port = free_port()
        self.url = f"nats://{address}:{self.port}"
        store = os.path.join(work, f"nats-{uuid.uuid4().hex[:8]}")
        command = ["nats-server", "-js", "-a", address, "-p", str(self.port), "-sd", store]
        if host:
            command = ["ip", "netns", "exec", host.name, *command]
        log = open(f"{store}.log", "w")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        if not wait_until(lambda: asyncio.run(self._answers()), 30):
            fail(what, "nats-server never answered")
        asyncio.run(self._add_stream())

    async def _answers(self):
        async def quiet(_error):
            pass  # a refused connection while the server starts is expected, not news
        try:
            nc = await nats.connect(self.url, connect_timeout=1, allow_reconnect=False,
                                    error_cb=quiet)
        except Exception:  # noqa: BLE001 - not up yet, whatever the client says
            return False
        await nc.close()
        return True

    async def _add_stream(self):
        nc = await nats.connect(self.url)
        await nc.jetstream().add_stream(name=self.STREAM, subjects=["plantstore.plants.>"],
                                        storage=StorageType.FILE)
        await nc.close()

    def read(self):
        """Every message's (subject, Nats-Msg-Id), in stream order."""
        return asyncio.run(self._read())

    async def _read(self):
        nc = await nats.connect(self.url)
        sub = await nc.jetstream().pull_subscribe(
            "plantstore.plants.>", durable=f"check-{uuid.uuid4().hex[:8]}", stream=self.STREAM)
        read = []
        while True:
            try:
                messages = await sub.fetch(500, timeout=2)
            # nats-py's fetch may time out as its own TimeoutError or as asyncio's,
            # of which its own is a subclass.
            except asyncio.TimeoutError:
                break
            for msg in messages:
                read.append((msg.subject, msg.headers["Nats-Msg-Id"]))
                await msg.ack()
        await nc.close()
        return read

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def destination(binary, service_url):
    """The one stream destination as `streams list --json` shows it; {} if none is."""
    out = subprocess.run([binary, "streams", "list", "--json"],
                         env=dict(os.environ, DATABASE_URL=service_url), capture_output=True,
                         text=True)
    listed = json.loads(out.stdout) if out.returncode == 0 else []
    return listed[0] if len(listed) == 1 else {}


def wait_for_nothing_pending(binary, service_url, seconds):
    """Whether the one stream destination had nothing pending within `seconds`."""
    return wait_until(lambda: destination(binary, service_url).get("pending") == 0, seconds)


def check_stream(binary, service_url, log_url, broker, case):
    """Waits until the destination has nothing pending, then compares the stream with the
    deletion log read at `log_url`: each event (a deletion, and its restore if any) once,
    each plant's in log order. Prints the counts for `case`; fails on any difference."""
    if not wait_for_nothing_pending(binary, service_url, 120):
        fail(broker.what, f"{case}: the stream destination still had events pending after 120 s")
    expected = collections.defaultdict(list)
    rows = psql_or_sqlite(log_url, "SELECT plant_id || '|' || id || '|' || CASE WHEN "
                                   "restored_at IS NULL THEN 0 ELSE 1 END "
                                   "FROM plantstore_deletions ORDER BY id")
    for row in rows:
        plant, entry, restored = row.split("|")
        expected[plant].append(f"deletion_{entry}")
        if restored == "1":
            expected[plant].append(f"restore_{entry}")
    messages = broker.read()
    got = collections.defaultdict(list)
    for subject, msg_id in messages:
        got[subject.rsplit(".", 1)[-1]].append(msg_id)
    events = sum(len(ids) for ids in expected.values())
    distinct = len({msg_id for _, msg_id in messages})
    violations = sum(1 for plant, ids in expected.items() if got.get(plant) != ids)
    violations += sum(1 for plant in got if plant not in expected)
    print(f"exactly-once check, {case}: log events {events}, messages in the stream "
          f"{len(messages)}, distinct ids {distinct}, per-plant order violations {violations}")
    if not events == len(messages) == distinct or violations:
        fail(broker.what, f"{case}: the stream does not hold every deletion log event exactly "
                          "once, in order")

"""The id plan of one run: the range of ids each deleting run may delete, and the rows each
database is seeded with."""

from __future__ import annotations

from dataclasses import dataclass

from .common import BACKENDS, CONNS
from .webhooks import PAIRS, RECEIVERS

MIN_ROWS = 1_000_000
# Each deleting run gets its own id range. Service hit runs reached 26,000 deletes a second
# here (and ran out of a 25,000-a-second range once), so they get 60,000; the raw anchors
# (pgbench at most about 20,000 tps, sqlite-raw about 10,000) get twice 25,000.
IDS_PER_SECOND = 60_000
RAW_IDS_PER_SECOND = 25_000


class Ids:
    def __init__(self):
        self.next = 1

    def take(self, n):
        lo = self.next
        self.next += n
        return lo, self.next


@dataclass
class Plan:
    """Which ids each deleting run may delete, and how many rows each database is seeded with."""

    span: int
    hits: dict
    hooked: dict
    # `--guard`: the runs with a destination made with REV's build.
    hooked_before: dict
    beside: dict
    pgbench: dict
    raw_sqlite: tuple
    rows: dict
    # `--guard`: a hit range per run, before and after alternated (guard.py).
    guard: dict
    # `--standby`: PostgreSQL hit ranges with an endpoint, without and with the barrier
    # alternated (standby.py).
    standby: list


def plan_ids(seconds: int, guarding: bool) -> Plan:
    # Id ranges: every deleting run its own [lo, hi), never shared, never reused.
    span = seconds * IDS_PER_SECOND
    raw_span = seconds * RAW_IDS_PER_SECOND
    ids = {b: Ids() for b in BACKENDS}
    guard = {b: [ids[b].take(span) for _ in range(2 * PAIRS)] if guarding else []
             for b in BACKENDS}
    hits = {b: {n: ids[b].take(span) for n in CONNS} if not guarding else {}
            for b in BACKENDS}
    hooked = {b: {r: [ids[b].take(span) for _ in range(PAIRS)] for r in RECEIVERS}
              for b in BACKENDS}
    hooked_before = {b: {r: [ids[b].take(span) for _ in range(PAIRS)] for r in RECEIVERS}
                     if guarding else {} for b in BACKENDS}
    beside = {b: [ids[b].take(span) for _ in range(PAIRS)] for b in BACKENDS}
    standby = [ids["postgres"].take(span) for _ in range(2 * PAIRS)] if guarding else []
    # pgbench splits its range into one block per client; twice the span leaves each client
    # room for twice its even share (a client past its block asks for id 0 and the check fails).
    pgbench = {n: ids["postgres"].take(2 * raw_span) for n in CONNS} if not guarding else {}
    # sqlite-raw has no bound of its own: its range is the highest, twice the span, so even an
    # overrun only reaches ids that were never seeded (and its check fails).
    raw_sqlite = ids["sqlite"].take(2 * raw_span) if not guarding else (0, 0)
    rows = {b: max(MIN_ROWS, ids[b].next - 1) for b in BACKENDS}
    return Plan(span, hits, hooked, hooked_before, beside, pgbench, raw_sqlite, rows, guard, standby)

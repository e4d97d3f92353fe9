"""Checks in the database that every delete a run reports happened, once, with its audit row."""

from __future__ import annotations

import math


def issued_case(lo: int, data: dict) -> str:
    """SQL predicate: `id` was sent by wrk (thread t sends lo+t, lo+t+T, ...; k_t of them)."""
    stride = data["threads_n"]
    whens = " ".join(f"WHEN {t['tid']} THEN {t['generated']}" for t in data["threads"])
    return f"(id - {lo}) / {stride} < CASE (id - {lo}) % {stride} {whens} ELSE 0 END"


def verify_hits(db, lo: int, hi: int, before: int, data: dict) -> dict:
    """Every 204 matched a deleted row and an audit row, for ids [lo, hi).

    wrk stops at the deadline with up to one request per connection sent but its response never
    read, so the rows deleted may exceed the 204s by at most that many (`unanswered`: requests
    generated minus responses read; wrk 4 also calls request() once at start-up on thread 0 to
    check the script and never sends that one, so the bound is loose by one, never too tight).
    """
    rng = f"id >= {lo} AND id < {hi}"
    present = db.scalar(f"SELECT count(*) FROM plants WHERE {rng}")
    deleted = before - present
    stride = data["threads_n"]
    issued = 0
    for t in data["threads"]:
        in_range = max(0, math.ceil((hi - lo - t["tid"]) / stride))
        issued += min(t["generated"], in_range)
    present_issued = db.scalar(f"SELECT count(*) FROM plants WHERE {rng} AND {issued_case(lo, data)}")
    deleted_outside = deleted - (issued - present_issued)
    arng = f"plant_id >= {lo} AND plant_id < {hi}"
    audit = db.scalar(f"SELECT count(*) FROM plantstore_deletions WHERE {arng}")
    audit_distinct = db.scalar(f"SELECT count(DISTINCT plant_id) FROM plantstore_deletions WHERE {arng}")
    audit_live = db.scalar(
        f"SELECT count(*) FROM plantstore_deletions d WHERE {arng.replace('plant_id', 'd.plant_id')} "
        "AND EXISTS (SELECT 1 FROM plants p WHERE p.id = d.plant_id)"
    )
    n204 = int(data["statuses"].get("204", 0))
    unanswered = max(0, data["generated"] - data["responses"])
    problems = []
    if before != hi - lo:
        problems.append(f"range had {before} rows before the run, not {hi - lo}")
    if audit != deleted:
        problems.append(f"audit rows {audit} != rows deleted {deleted}")
    if audit_distinct != audit:
        problems.append(f"{audit - audit_distinct} plants audited twice")
    if audit_live:
        problems.append(f"{audit_live} audit rows for plants that still exist")
    if deleted_outside:
        problems.append(f"{deleted_outside} rows deleted that no request asked for")
    if deleted < n204:
        problems.append(f"204s {n204} > rows deleted {deleted}")
    elif deleted - n204 > unanswered:
        problems.append(f"rows deleted {deleted} exceed 204s {n204} by more than the "
                        f"{unanswered} requests left unanswered at wrk's deadline")
    return {
        "lo": lo, "hi": hi, "rows_before": before, "n204": n204, "deleted": deleted,
        "audit": audit, "audit_live": audit_live, "deleted_outside": deleted_outside,
        "unanswered": unanswered, "ok": not problems, "problems": problems,
    }


def describe_hits_check(v: dict) -> str:
    gap = v["deleted"] - v["n204"]
    s = (f"ids [{v['lo']}, {v['hi']}): 204s {v['n204']}, rows deleted {v['deleted']}, "
         f"audit rows {v['audit']}, audit rows of live plants {v['audit_live']}, "
         f"deleted but never asked for {v['deleted_outside']}")
    if gap:
        s += f", deleted without a 204 read {gap} (≤ {v['unanswered']} in flight at wrk's deadline)"
    return s + (" -> OK" if v["ok"] else " -> FAIL: " + "; ".join(v["problems"]))


def verify_blocks(db, lo: int, hi: int, before: int, per: int, counts: dict[int, int],
                  total: int) -> dict:
    """Raw anchors: client c deleted exactly ids lo+c*per .. lo+c*per+counts[c]-1, one each."""
    rng = f"id >= {lo} AND id < {hi}"
    present = db.scalar(f"SELECT count(*) FROM plants WHERE {rng}")
    deleted = before - present
    whens = " ".join(f"WHEN {c} THEN {n}" for c, n in sorted(counts.items()))
    left = db.scalar(
        f"SELECT count(*) FROM plants WHERE {rng} AND "
        f"(id - {lo}) % {per} < CASE (id - {lo}) / {per} {whens or 'WHEN -1 THEN 0'} ELSE 0 END"
    )
    problems = []
    if before != hi - lo:
        problems.append(f"range had {before} rows before the run, not {hi - lo}")
    if deleted != total:
        problems.append(f"rows deleted {deleted} != transactions {total}")
    if left:
        problems.append(f"{left} ids that a transaction should have deleted are still there")
    if any(n > per for n in counts.values()):
        problems.append("a client ran past its id range")
    return {"lo": lo, "hi": hi, "deleted": deleted, "transactions": total, "not_deleted": left,
            "ok": not problems, "problems": problems}


def describe_blocks_check(v: dict) -> str:
    s = (f"ids [{v['lo']}, {v['hi']}): transactions {v['transactions']}, rows deleted "
         f"{v['deleted']}, ids left undeleted {v['not_deleted']}")
    return s + (" -> OK" if v["ok"] else " -> FAIL: " + "; ".join(v["problems"]))

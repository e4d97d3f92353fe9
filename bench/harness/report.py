"""The report: one row per measured run, the markdown tables, the targets and results.md's text."""

from __future__ import annotations

from .checks import describe_blocks_check, describe_hits_check
from .common import (BACKEND_NAME, BACKENDS, CONNS, READYZ_STARTS, WORKLOADS, fmt, fmt_rate,
                     fmt_ratio, ratio)
from .load import fmt_unexpected

# Targets from the issue.
T_HITS_VS_RAW = 2.0
T_HITS_VS_OWN_401 = 0.8
T_401_VS_NGINX = 0.5
T_P50_VS_RAW = 1.5
T_RSS_MIB = 30.0
T_READYZ_MS = 200.0


def result_rows(R: dict) -> list[dict]:
    rows = []
    raw_sqlite = R["anchors"]["sqlite-raw"]
    for backend in BACKENDS:
        for workload in WORKLOADS:
            for conns in CONNS:
                r = R["service"][backend][workload][str(conns)]
                if workload == "hits":
                    if backend == "sqlite":
                        anchor, aname = raw_sqlite, "sqlite-raw"
                    else:
                        anchor, aname = R["anchors"]["pgbench"][str(conns)], f"pgbench {conns}"
                else:
                    anchor, aname = R["anchors"]["nginx"][str(conns)], f"nginx {conns}"
                check = r.get("check")
                rows.append({
                    "backend": backend, "what": workload, "conns": conns, "rps": r["rps"],
                    "p50": r["p50_ms"], "p99": r["p99_ms"], "rss": r["peak_rss_mib"],
                    "anchor": aname, "ratio": ratio(r["rps"], anchor["rps"]),
                    "odd": fmt_unexpected(r["unexpected"]),
                    "check": "—" if check is None else ("OK" if check["ok"] else "FAIL"),
                })
    rows.append({"backend": "sqlite", "what": "sqlite-raw (anchor)", "conns": 1,
                 "rps": raw_sqlite["rps"], "p50": raw_sqlite["p50_ms"], "p99": raw_sqlite["p99_ms"],
                 "rss": None, "anchor": "—", "ratio": None, "odd": "none",
                 "check": "OK" if raw_sqlite["check"]["ok"] else "FAIL"})
    for conns in CONNS:
        a = R["anchors"]["pgbench"][str(conns)]
        rows.append({"backend": "postgres", "what": "pgbench (anchor)", "conns": conns,
                     "rps": a["rps"], "p50": a["p50_ms"], "p99": a["p99_ms"], "rss": None,
                     "anchor": "—", "ratio": None,
                     "odd": "none" if not a["failed"] else f"failed: {a['failed']}",
                     "check": "OK" if a["check"]["ok"] else "FAIL"})
    for conns in CONNS:
        a = R["anchors"]["nginx"][str(conns)]
        rows.append({"backend": "—", "what": "nginx 204 (anchor)", "conns": conns, "rps": a["rps"],
                     "p50": a["p50_ms"], "p99": a["p99_ms"], "rss": None, "anchor": "—",
                     "ratio": None, "odd": fmt_unexpected(a["unexpected"]), "check": "—"})
    return rows


def markdown_table(rows: list[dict]) -> str:
    head = ("| backend | workload | conns | req/s | p50 ms | p99 ms | peak RSS MiB | anchor | "
            "ratio | unexpected | check |")
    out = [head, "|---|---|--:|--:|--:|--:|--:|---|--:|---|---|"]
    for r in rows:
        out.append(
            f"| {r['backend']} | {r['what']} | {r['conns']} | {fmt_rate(r['rps'])} | "
            f"{fmt(r['p50'])} | {fmt(r['p99'])} | {'—' if r['rss'] is None else fmt(r['rss'], 1)} | "
            f"{r['anchor']} | {fmt_ratio(r['ratio']) if r['anchor'] != '—' else '—'} | "
            f"{r['odd']} | {r['check']} |"
        )
    return "\n".join(out)


def targets(R: dict) -> list[dict]:
    S = R["service"]
    A = R["anchors"]
    out = []

    def add(name, measured, value, limit, higher_is_better, note=""):
        if value is None:
            verdict = "MISS"
        else:
            verdict = "PASS" if (value >= limit if higher_is_better else value <= limit) else "MISS"
        out.append({"target": name, "measured": measured, "value": value, "limit": limit,
                    "higher_is_better": higher_is_better, "result": verdict, "note": note})

    for backend, anchor, aname in (("postgres", A["pgbench"]["64"], "pgbench at 64 clients"),
                                   ("sqlite", A["sqlite-raw"], "sqlite-raw")):
        name = BACKEND_NAME[backend]
        hits = S[backend]["hits"]["64"]["rps"]
        own401 = S[backend]["401s"]["64"]["rps"]
        r = ratio(hits, anchor["rps"])
        add(f"{name} hits at 64 ≥ {T_HITS_VS_RAW:g}× {aname}",
            f"{fmt_rate(hits)} / {fmt_rate(anchor['rps'])} req/s", r, T_HITS_VS_RAW, True)
        r = ratio(hits, own401)
        add(f"{name} hits at 64 ≥ {T_HITS_VS_OWN_401:g}× its own 401s at 64 (alternative)",
            f"{fmt_rate(hits)} / {fmt_rate(own401)} req/s", r, T_HITS_VS_OWN_401, True)
    nginx64 = A["nginx"]["64"]["rps"]
    for backend in BACKENDS:
        v = S[backend]["401s"]["64"]["rps"]
        add(f"{BACKEND_NAME[backend]} 401s at 64 ≥ {T_401_VS_NGINX:g}× nginx at 64",
            f"{fmt_rate(v)} / {fmt_rate(nginx64)} req/s", ratio(v, nginx64), T_401_VS_NGINX, True)
    for backend, anchor, aname in (("sqlite", A["sqlite-raw"], "sqlite-raw"),
                                   ("postgres", A["pgbench"]["1"], "pgbench at 1 client")):
        v = S[backend]["hits"]["1"]["p50_ms"]
        add(f"{BACKEND_NAME[backend]} hits at 1: p50 ≤ {T_P50_VS_RAW:g}× {aname} p50",
            f"{fmt(v, 3)} / {fmt(anchor['p50_ms'], 3)} ms", ratio(v, anchor["p50_ms"]),
            T_P50_VS_RAW, False)
    rss = [(S[b][w]["64"]["peak_rss_mib"], f"{b} {w}") for b in BACKENDS for w in WORKLOADS
           if S[b][w]["64"]["peak_rss_mib"] is not None]
    top = max(rss) if rss else (None, "")
    add(f"peak RSS at 64 connections ≤ {T_RSS_MIB:g} MiB (max over the 64-connection runs)",
        f"{fmt(top[0], 1)} MiB ({top[1]})", top[0], T_RSS_MIB, False)
    rz = R["readyz"]
    add(f"SQLite start to /readyz 200 ≤ {T_READYZ_MS:g} ms (median of {READYZ_STARTS})",
        f"{fmt(rz['median_ms'], 1)} ms (starts: {', '.join(fmt(x, 1) for x in rz['ms'])})",
        rz["median_ms"], T_READYZ_MS, False)
    return out


def targets_table(ts: list[dict]) -> str:
    out = ["| target | measured | ratio / value | result |", "|---|---|--:|---|"]
    for t in ts:
        if "MiB" in t["target"]:
            value = f"{fmt(t['value'], 1)} MiB"
        elif "ms (median" in t["target"]:
            value = f"{fmt(t['value'], 1)} ms"
        else:
            value = fmt_ratio(t["value"])
        out.append(f"| {t['target']} | {t['measured']} | {value} | **{t['result']}** |")
    return "\n".join(out)


def report_head(R: dict) -> list[str]:
    m, fl, config = R["machine"], R["fsync"], R["config"]
    rows = config["rows"]
    return [
        "# Plant Store benchmark",
        "",
        "Figures from one run of `bench/run`. **Never compare them with another run's**: the "
        "disk and the machine change from day to day; every ratio below is within this run.",
        "",
        f"- machine: {m['nproc']} cores, {m['cpu_model']}, kernel {m['kernel']}, "
        f"{fmt(m['mem_gib'], 1)} GiB; PostgreSQL {m.get('postgres', '?')}",
        f"- date: {m['date']}; commit {m['commit']}",
        f"- disk: **{fl['fsyncs_per_s']:,.0f} fsyncs/s, {fl['ms_per_fsync']:.3f} ms per fsync** "
        f"(4 KiB pwrite+fsync for {fl['seconds']:.1f} s on {fl['filesystem']}, beside the "
        "SQLite database)",
        f"- {config['seconds']} s per run; wrk -t1 (1 connection) / -t2, --timeout 10s; "
        f"rows seeded: SQLite {rows['sqlite']:,}, PostgreSQL {rows['postgres']:,}; "
        f"every deleting run has its own {config['ids_per_run']:,} ids",
        f"- total time {R['elapsed_s'] / 60:.1f} min",
        "",
    ]


def checks_section(R: dict) -> list[str]:
    checks = ["## Checks against the database (hit runs and raw anchors)", ""]
    for b in BACKENDS:
        for conns in CONNS:
            checks.append(f"- {b} hits c={conns}: "
                          f"{describe_hits_check(R['service'][b]['hits'][str(conns)]['check'])}")
    checks.append(f"- sqlite-raw: {describe_blocks_check(R['anchors']['sqlite-raw']['check'])}")
    for conns in CONNS:
        checks.append(f"- pgbench c={conns}: "
                      f"{describe_blocks_check(R['anchors']['pgbench'][str(conns)]['check'])}")
    return checks


def results_markdown(R: dict, table: str, ttable: str) -> str:
    """results.md: the run's facts, the results table, the targets and the database checks."""
    results = ["## Results", "", table, "",
               "Ratio: req/s over the anchor's req/s. Anchor of hits: the raw database delete "
               "(pgbench at the same client count; sqlite-raw, one writer, for every SQLite row). "
               "Anchor of misses and 401s: nginx at the same connection count.", ""]
    return "\n".join(report_head(R) + results + ["## Targets", "", ttable, ""]
                     + checks_section(R)) + "\n"

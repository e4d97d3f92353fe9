"""The charts, as hand-written SVG: bench/run's requests per second by connection count, and
bench/soak --faults' figures by minute."""

from __future__ import annotations

import math

from .common import CONNS


def nice_step(span: float, ticks: int = 5) -> float:
    raw = span / ticks
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def short(v: float | None) -> str:
    if v is None:
        return "n/a"
    if v >= 100_000:
        return f"{v / 1000:.0f}k"
    if v >= 1000:
        return f"{v / 1000:.1f}".removesuffix(".0") + "k"
    return f"{v:.0f}"


def bar_label(v: float) -> str:
    return f"{v:,.0f}" if v < 10_000 else f"{v / 1000:.1f}k"


def esc(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


# Three panels side by side; the room above each plot is its title and legend.
PANEL_W, PANEL_H, PANEL_GAP = 420, 400, 24
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 70, 14, 104, 56
PLOT_W, PLOT_H = PANEL_W - PAD_LEFT - PAD_RIGHT, PANEL_H - PAD_TOP - PAD_BOTTOM


def chart_panels(R: dict) -> list[dict]:
    S, A = R["service"], R["anchors"]
    c = [str(n) for n in CONNS]
    return [
        {"title": "SQLite: DELETE that deletes (hits)", "xlabel": "connections",
         "series": [("service hits", "#2b6cb0", [S["sqlite"]["hits"][k]["rps"] for k in c]),
                    ("sqlite-raw (1 writer, same at every count)", "#dd6b20",
                     [A["sqlite-raw"]["rps"]] * 3)]},
        {"title": "PostgreSQL: DELETE that deletes (hits)",
         "xlabel": "connections (pgbench: clients)",
         "series": [("service hits", "#2b6cb0", [S["postgres"]["hits"][k]["rps"] for k in c]),
                    ("pgbench prepared DELETE (clients = conns)", "#dd6b20",
                     [A["pgbench"][k]["rps"] for k in c])]},
        {"title": "401s (no token) vs nginx return 204", "xlabel": "connections",
         "series": [("SQLite service 401s", "#2b6cb0", [S["sqlite"]["401s"][k]["rps"] for k in c]),
                    ("PostgreSQL service 401s", "#38a169",
                     [S["postgres"]["401s"][k]["rps"] for k in c]),
                    ("nginx return 204", "#718096", [A["nginx"][k]["rps"] for k in c])]},
    ]


def chart_header(R: dict, width: int, height: int) -> list[str]:
    m = R["machine"]
    f = R["fsync"]
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
         f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, Helvetica, sans-serif">',
         f'<rect width="{width}" height="{height}" fill="#ffffff"/>',
         f'<text x="20" y="30" font-size="19" font-weight="bold" fill="#1a202c">Plant Store '
         f'DELETE /plants/{{id}}: requests per second by connection count</text>',
         f'<text x="20" y="52" font-size="12.5" fill="#4a5568">{esc(m["date"])} · {m["nproc"]} '
         f'cores · {esc(m["cpu_model"])} · kernel {esc(m["kernel"])} · disk {f["fsyncs_per_s"]:,.0f} '
         f'fsyncs/s · {R["config"]["seconds"]} s per run · commit {esc(m["commit"])}</text>',
         f'<text x="20" y="70" font-size="12.5" fill="#c53030">One run of bench/run; '
         f'never compare these bars with another run\'s.</text>']
    return o


def panel_frame(panel: dict, x0: int, y0: int) -> list[str]:
    """The panel's background, title and legend."""
    o = [f'<rect x="{x0}" y="{y0}" width="{PANEL_W}" height="{PANEL_H}" fill="#f7fafc" '
         f'stroke="#e2e8f0"/>',
         f'<text x="{x0 + 12}" y="{y0 + 24}" font-size="14" font-weight="bold" '
         f'fill="#1a202c">{esc(panel["title"])}</text>']
    for j, (name, color, _) in enumerate(panel["series"]):
        ly = y0 + 42 + j * 17
        o.append(f'<rect x="{x0 + 12}" y="{ly - 10}" width="12" height="12" fill="{color}"/>')
        o.append(f'<text x="{x0 + 30}" y="{ly}" font-size="12" fill="#2d3748">{esc(name)}</text>')
    return o


def panel_y_axis(x0: int, px: int, py: int, ymax: float, step: float) -> list[str]:
    """Grid, ticks and label of the y axis."""
    o = []
    t = 0.0
    while t <= ymax + step / 2:
        y = py + PLOT_H - t / ymax * PLOT_H
        o.append(f'<line x1="{px}" y1="{y:.1f}" x2="{px + PLOT_W}" y2="{y:.1f}" '
                 f'stroke="{"#a0aec0" if t == 0 else "#e2e8f0"}"/>')
        o.append(f'<text x="{px - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
                 f'fill="#4a5568">{short(t)}</text>')
        t += step
    o.append(f'<line x1="{px}" y1="{py}" x2="{px}" y2="{py + PLOT_H}" stroke="#a0aec0"/>')
    cy = py + PLOT_H / 2
    o.append(f'<text x="{x0 + 16}" y="{cy:.1f}" font-size="12" text-anchor="middle" '
             f'fill="#2d3748" transform="rotate(-90 {x0 + 16} {cy:.1f})">requests / s</text>')
    return o


def panel_bars(panel: dict, px: int, py: int, ymax: float) -> list[str]:
    """One group of bars per connection count, its label under it, and the x axis's label."""
    o = []
    n = len(panel["series"])
    group_w = PLOT_W / len(CONNS)
    bar_w = group_w * 0.78 / n
    for g, conns in enumerate(CONNS):
        gx = px + g * group_w + group_w * 0.11
        for j, (_, color, vs) in enumerate(panel["series"]):
            v = vs[g]
            bx = gx + j * bar_w
            if v is None:
                o.append(f'<text x="{bx + bar_w / 2:.1f}" y="{py + PLOT_H - 4}" font-size="10" '
                         f'text-anchor="middle" fill="#718096">n/a</text>')
                continue
            bh = v / ymax * PLOT_H
            o.append(f'<rect x="{bx + 1:.1f}" y="{py + PLOT_H - bh:.1f}" width="{bar_w - 2:.1f}" '
                     f'height="{bh:.1f}" fill="{color}"><title>{v:,.0f} req/s</title></rect>')
            o.append(f'<text x="{bx + bar_w / 2:.1f}" y="{py + PLOT_H - bh - 4:.1f}" '
                     f'font-size="10" text-anchor="middle" fill="#1a202c">{bar_label(v)}</text>')
        o.append(f'<text x="{px + g * group_w + group_w / 2:.1f}" y="{py + PLOT_H + 18}" '
                 f'font-size="12" text-anchor="middle" fill="#2d3748">{conns}</text>')
    o.append(f'<text x="{px + PLOT_W / 2:.1f}" y="{py + PLOT_H + 40}" font-size="12" '
             f'text-anchor="middle" fill="#2d3748">{esc(panel["xlabel"])}</text>')
    return o


def panel_svg(panel: dict, i: int) -> list[str]:
    x0 = 20 + i * (PANEL_W + PANEL_GAP)
    y0 = 84
    px, py = x0 + PAD_LEFT, y0 + PAD_TOP
    vals = [v for _, _, vs in panel["series"] for v in vs if v is not None]
    vmax = max(vals) if vals else 1.0
    step = nice_step(vmax * 1.12 or 1.0)
    ymax = step * math.ceil(vmax * 1.12 / step) if vmax > 0 else step * 5
    return (panel_frame(panel, x0, y0) + panel_y_axis(x0, px, py, ymax, step)
            + panel_bars(panel, px, py, ymax))


def chart_svg(R: dict) -> str:
    width = 3 * PANEL_W + 2 * PANEL_GAP + 40
    height = PANEL_H + 96
    o = chart_header(R, width, height)
    for i, panel in enumerate(chart_panels(R)):
        o += panel_svg(panel, i)
    o.append("</svg>")
    return "\n".join(o) + "\n"


def soak_faults_svg(rows: list[dict], faults: list[tuple[float, str]]) -> str:
    """bench/soak --faults' chart: six small line charts of the minute figures (the rows of
    its minute table), each with the faults (minute, what) marked."""
    panels = [
        ("Deletes answered 204 per second", [("hits_s", "#1f77b4")]),
        ("Delete p99 (ms)", [("p99_ms", "#d62728")]),
        ("RSS (MiB)", [("rss_a", "#1f77b4"), ("rss_b", "#ff7f0e")]),
        ("Open descriptors", [("fds_a", "#1f77b4"), ("fds_b", "#ff7f0e")]),
        ("Delivery lag p99 (s)", [("lag_p99_s", "#2ca02c")]),
        ("Deletion log entries", [("log_entries", "#9467bd")]),
    ]
    w, h, pad = 440, 220, 46
    cols = 2
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{cols * w}" '
           f'height="{(len(panels) + 1) // 2 * h + 30}" font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           '<text x="10" y="18" font-size="13">bench/soak --faults: each minute of the hour '
           '(instance a blue, b orange; dashed lines: the faults)</text>']
    last = max((r["minute"] for r in rows), default=1) or 1
    for i, (title, series) in enumerate(panels):
        x0, y0 = (i % cols) * w, 30 + (i // cols) * h
        values = [r[key] for r in rows for key, _ in series if r.get(key) is not None]
        top = max(values, default=1) * 1.1 or 1
        px = lambda m: x0 + pad + (w - pad - 14) * m / last  # noqa: E731
        py = lambda v: y0 + h - 28 - (h - 58) * v / top  # noqa: E731
        out.append(f'<text x="{x0 + pad}" y="{y0 + 18}" font-size="12">{title}</text>')
        out.append(f'<line x1="{px(0)}" y1="{py(0)}" x2="{px(last)}" y2="{py(0)}" '
                   'stroke="#888"/>')
        out.append(f'<text x="{x0 + 4}" y="{py(top / 1.1) + 4}">{top / 1.1:,.0f}</text>')
        out.append(f'<text x="{x0 + 4}" y="{py(0) + 4}">0</text>')
        out.append(f'<text x="{px(last) - 40}" y="{py(0) + 16}">{last:.0f} min</text>')
        for at, _ in faults:
            out.append(f'<line x1="{px(at)}" y1="{y0 + 26}" x2="{px(at)}" y2="{py(0)}" '
                       'stroke="#aaa" stroke-dasharray="4 3"/>')
        for key, colour in series:
            points = " ".join(f"{px(r['minute']):.1f},{py(r[key]):.1f}"
                              for r in rows if r.get(key) is not None)
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" '
                       f'points="{points}"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"

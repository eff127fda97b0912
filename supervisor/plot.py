"""``supervise report --plot FILE.html``: the campaign as one self-contained page (an SVG timeline, no scripts).

Each attempt is a bar from its launch to its end, coloured by outcome; gaps between bars are restart and queue
time; the goodput split is drawn underneath. Pure: report dict in, HTML text out.
"""

from __future__ import annotations

import html
from typing import Any

COLOURS = {
    "completed": "#2e7d32", "preemption": "#6d8fb3", "timeout": "#8e7cc3", "cancelled": "#9e9e9e",
    "node_failure": "#c62828", "hardware": "#ad1457", "hang": "#ef6c00", "comm_error": "#f9a825",
    "app_error": "#6a1b9a", "numerical": "#00838f", "unknown": "#757575", "running": "#90caf9",
}  # fmt: skip
BADPUT_COLOURS = {"lost_work": "#e57373", "restart": "#ffb74d", "checkpoint": "#9575cd", "queue": "#90a4ae",
                  "detection": "#f06292", "other": "#e0e0e0"}  # fmt: skip


def render_html(report: dict[str, Any], now: float) -> str:
    attempts = report["attempts"]
    width, left, row_h = 900, 170, 26
    t0 = min((a["start"] for a in attempts), default=now)
    t1 = max([a["end"] or now for a in attempts] + [t0 + 1])
    scale = (width - left - 20) / (t1 - t0)
    rows = []
    for i, a in enumerate(attempts):
        outcome = (a["outcome"] or {}).get("class", "running")
        x = left + (a["start"] - t0) * scale
        w = max(2.0, ((a["end"] or now) - a["start"]) * scale)
        y = 30 + i * row_h
        label = f"job {a['job_id']} r{a['restart']} #{a['launch']}"
        tip = f"{outcome}: {'; '.join((a['outcome'] or {}).get('evidence', [])[:2])}"
        rows.append(
            f'<text x="8" y="{y + 15}" font-size="12">{html.escape(label)}</text>'
            f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{row_h - 6}" fill="{COLOURS.get(outcome, "#757575")}">'
            f"<title>{html.escape(tip)}</title></rect>"
            f'<text x="{x + w + 4:.1f}" y="{y + 15}" font-size="11">{html.escape(outcome)}</text>'
        )
    g = report["goodput"]
    wall = g["wall_s"] or 1.0
    y = 40 + len(attempts) * row_h
    bars, x = [], float(left)
    parts = [("productive", g["productive_s"], "#43a047")] + [
        (k, v, BADPUT_COLOURS[k]) for k, v in g["badput_s"].items() if k in BADPUT_COLOURS
    ]
    for name, seconds, colour in parts:
        w = (width - left - 20) * seconds / wall
        if w > 0:
            bars.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="18" fill="{colour}">'
                        f"<title>{name}: {seconds:.1f} s</title></rect>")  # fmt: skip
            x += w
    legend = " ".join(f'<span style="background:{c};padding:0 6px">&nbsp;</span> {html.escape(n)} {s:.1f} s'
                      for n, s, c in parts)  # fmt: skip
    height = y + 40
    ettr = "-" if g["ettr"] is None else f"{g['ettr']:.1%}"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>campaign {html.escape(str(report['campaign']))}</title></head>
<body style="font-family:sans-serif">
<h2>{html.escape(str(report['campaign']))}: {html.escape(report['state'])}</h2>
<p>{len(attempts)} attempts; wall {g['wall_s']:.1f} s; productive {g['productive_s']:.1f} s; ETTR {ettr};
excluded nodes: {html.escape(', '.join(report['excluded_nodes']) or 'none')}</p>
<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">
<text x="8" y="18" font-size="12">attempts (hover for the evidence)</text>
{''.join(rows)}
<text x="8" y="{y + 14}" font-size="12">goodput</text>
{''.join(bars)}
</svg>
<p style="font-size:12px">{legend}</p>
</body></html>
"""

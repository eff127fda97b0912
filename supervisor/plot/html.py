"""Self-contained HTML pictures (inline SVG, no scripts, no network): a campaign's timeline, the simulator's
comparison. Hovering an element shows its details (SVG ``<title>``)."""

from __future__ import annotations

import html
import math
from datetime import datetime, timezone
from typing import Any

from supervisor.plot.timeline import Timeline, colour, duration, end_of, place_labels, thinned

_W, _LEFT, _RIGHT = 1100, 120, 30
_STYLE = "font-family:DejaVu Sans,Arial,sans-serif;margin:16px;color:#222"


def _esc(value: object) -> str:
    return html.escape(str(value))


def _ticks(t0: float, t1: float) -> list[tuple[float, str]]:
    """Round wall-clock ticks (UTC) with the date shown where it changes."""
    span = max(t1 - t0, 1.0)
    step = next(s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400,
                            172800, 604800, 2592000, 1e12) if span / s <= 8)  # fmt: skip
    out, last_day = [], ""
    t = math.ceil(t0 / step) * step
    while t <= t1:
        d = datetime.fromtimestamp(t, tz=timezone.utc)
        day = d.strftime("%Y-%m-%d")
        clock = d.strftime("%H:%M:%S" if step < 60 else "%H:%M")
        out.append((t, f"{day} {clock}" if day != last_day else clock))
        last_day = day
        t += step
    return out


def timeline(tl: Timeline) -> str:
    nodes, lanes_title = tl.lane_nodes()
    plot_w = _W - _LEFT - _RIGHT
    x = lambda t: _LEFT + (t - tl.t0) / max(tl.t1 - tl.t0, 1e-9) * plot_w  # noqa: E731
    top, prog_h = 40, 230
    lanes_y = top + prog_h + 40
    lane_h = 20
    axis_y = lanes_y + max(1, len(nodes)) * lane_h + 8
    bar_y = axis_y + 60
    height = bar_y + 90
    out = []
    for a in tl.attempts:  # Slurm runs as bands
        x0, x1 = x(a.start), x(end_of(a, tl))
        out.append(f'<rect x="{x0:.1f}" y="{top}" width="{max(x1 - x0, 1):.1f}" height="{axis_y - top}" '
                   f'fill="{colour(a.outcome or "running")}" fill-opacity="0.12"><title>{_esc(a.label)}: '
                   f'{_esc(a.outcome)} {_esc(a.evidence)}</title></rect>')  # fmt: skip
    steps = [s for _, s in tl.progress] + [s for _, s in tl.checkpoints] + [1]
    smax = max(steps) * 1.4
    y = lambda s: top + prog_h - s / smax * prog_h  # noqa: E731
    if tl.progress:
        pts = [f"{x(t):.1f},{y(s):.1f}" for t, s in tl.progress]
        prev = tl.progress[-1][1]
        end = max(tl.progress[-1][0], max((end_of(la, tl) for la in tl.launches), default=tl.progress[-1][0]))
        pts.append(f"{x(end):.1f},{y(prev or 0):.1f}")
        out.append(f'<polyline points="{" ".join(pts)}" fill="none" stroke="#1e3a5f" stroke-width="2"/>')
    ticks, every = thinned(tl.checkpoints)
    for t, s in ticks:
        out.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{y(s) - 7:.1f}" y2="{y(s) + 7:.1f}" stroke="#5e35b1" '
                   f'stroke-width="2"><title>checkpoint step {s}</title></line>')  # fmt: skip
    labels = [m.cls + (f" ({', '.join(m.blamed[:2])})" if m.blamed else "") for m in tl.interruptions]
    rows = place_labels([(x(m.t) - _LEFT) / plot_w for m in tl.interruptions], [(7.0 * len(t) + 6) / plot_w for t in labels])
    for m, text, (row, anchor) in zip(tl.interruptions, labels, rows, strict=True):
        xm = x(m.t)
        out.append(f'<line x1="{xm:.1f}" x2="{xm:.1f}" y1="{top}" y2="{axis_y}" stroke="{colour(m.cls)}" '
                   f'stroke-dasharray="5,3" stroke-width="1.5"><title>{_esc(m.cls)}: {_esc(m.text)}</title></line>')
        if row is not None:
            dx = -4 if anchor == "end" else 4
            out.append(f'<text x="{xm + dx:.1f}" y="{top + 14 + 15 * row}" font-size="12" text-anchor="{anchor}" '
                       f'fill="{colour(m.cls)}">{_esc(text)}</text>')  # fmt: skip
    out.append(f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{top}" y2="{top + prog_h}" stroke="#999"/>'
               f'<text x="{_LEFT - 8}" y="{y(0):.1f}" font-size="11" text-anchor="end">0</text>'
               f'<text x="{_LEFT - 8}" y="{y(max(steps)) + 4:.1f}" font-size="11" text-anchor="end">{max(steps)}</text>'
               f'<text x="8" y="{top + prog_h / 2:.1f}" font-size="12">training step</text>')  # fmt: skip
    index = {n: i for i, n in enumerate(nodes)}
    for n, i in index.items():
        out.append(f'<text x="{_LEFT - 8}" y="{lanes_y + i * lane_h + 14}" font-size="11" text-anchor="end">'
                   f"{_esc(n)}</text>")  # fmt: skip
    for la in tl.launches:
        x0, x1 = x(la.start), x(end_of(la, tl))
        for n in (n for n in la.nodes if n in index):
            out.append(f'<rect x="{x0:.1f}" y="{lanes_y + index[n] * lane_h + 3}" width="{max(x1 - x0, 1):.1f}" '
                       f'height="{lane_h - 6}" fill="{colour(la.outcome or "running")}" fill-opacity="0.85">'
                       f"<title>{_esc(la.label)} on {_esc(n)}: {_esc(la.outcome)}</title></rect>")  # fmt: skip
        for n in (n for n in la.blamed if n in index):
            cx, cy = x1, lanes_y + index[n] * lane_h + lane_h / 2
            out.append(f'<path d="M{cx - 6:.1f},{cy - 6:.1f} L{cx + 6:.1f},{cy + 6:.1f} M{cx - 6:.1f},{cy + 6:.1f} '
                       f'L{cx + 6:.1f},{cy - 6:.1f}" stroke="black" stroke-width="3"><title>blamed: {_esc(n)} '
                       f"({_esc(la.outcome)})</title></path>")  # fmt: skip
    out.append(f'<text x="8" y="{lanes_y - 8}" font-size="12">{_esc(lanes_title)} (X: blamed)</text>')
    out.append(f'<line x1="{_LEFT}" x2="{_W - _RIGHT}" y1="{axis_y}" y2="{axis_y}" stroke="#666"/>')
    for t, label in _ticks(tl.t0, tl.t1):
        xt = x(t)
        anchor = "end" if xt > _W - _RIGHT - 60 else ("start" if xt < _LEFT + 60 else "middle")
        out.append(f'<line x1="{xt:.1f}" x2="{xt:.1f}" y1="{axis_y}" y2="{axis_y + 5}" stroke="#666"/>'
                   f'<text x="{xt:.1f}" y="{axis_y + 19}" font-size="11" text-anchor="{anchor}">{_esc(label)}</text>')
    out.append(f'<text x="{_W - _RIGHT}" y="{axis_y + 36}" font-size="11" text-anchor="end">wall clock (UTC)</text>')
    out.append(_bar(tl.goodput, tl.wall_s, bar_y))
    ettr = "-" if tl.ettr is None else f"{tl.ettr:.1%}"
    legend = " ".join(f'<span style="background:{colour(c)};opacity:.5;padding:0 8px">&nbsp;</span> {_esc(c)}'
                      for c in dict.fromkeys(a.outcome or "running" for a in tl.attempts))  # fmt: skip
    return _page(f"campaign {tl.campaign}",
                 f"<h2>campaign {_esc(tl.campaign)}: {_esc(tl.state)}</h2><p>{len(tl.attempts)} Slurm runs, "
                 f"{len(tl.launches)} launches, {len(tl.interruptions)} interruptions; ETTR {ettr}. Bands: the "
                 f"Slurm runs, coloured by how they ended ({legend}); line: the step reached (a drop is lost work); "
                 f"ticks: checkpoints committed{'' if every == 1 else f' (every {every}th of {len(tl.checkpoints)})'}.</p>", _W, height, "".join(out))  # fmt: skip


def _bar(parts: list[tuple[str, float]], wall: float, y: float) -> str:
    wall = wall or sum(s for _, s in parts) or 1.0
    out, x = [f'<text x="8" y="{y + 14}" font-size="12">wall clock</text>'], float(_LEFT)
    width = _W - _LEFT - _RIGHT
    for name, seconds in parts:
        w = width * seconds / wall
        out.append(f'<rect x="{x:.1f}" y="{y}" width="{max(w, 0):.1f}" height="20" fill="{colour(name)}">'
                   f"<title>{_esc(name)}: {seconds:.1f} s ({seconds / wall:.1%})</title></rect>")  # fmt: skip
        x += w
    lx, ly = float(_LEFT), y + 40
    for name, seconds in parts:
        text = f"{name} {seconds / wall:.1%} ({duration(seconds)})"
        if lx + 24 + 7.5 * len(text) > _W - _RIGHT:
            lx, ly = float(_LEFT), ly + 18
        out.append(f'<rect x="{lx:.1f}" y="{ly - 10}" width="12" height="12" fill="{colour(name)}"/>'
                   f'<text x="{lx + 16:.1f}" y="{ly}" font-size="12">{_esc(text)}</text>')
        lx += 30 + 7.5 * len(text)
    return "".join(out)


def _page(title: str, header: str, width: int, height: float, body: str) -> str:
    return (f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{_esc(title)}</title></head>'
            f'<body style="{_STYLE}">{header}\n<svg xmlns="http://www.w3.org/2000/svg" width="100%" '
            f'style="max-width:{width}px;height:auto" viewBox="0 0 {width} {height:.0f}">{body}</svg></body></html>\n')
    # width 100% of the window up to its own: a narrow window scales the picture instead of cutting its right side


def comparison(doc: dict[str, Any]) -> str:
    w, yd = doc["world"], doc["young_daly"]
    rows = [("(a) naive Slurm requeue", doc["naive"]), ("(b) this supervisor", doc["supervised"])]
    left, width, out = 230, _W - 230 - 90, []
    for i, (label, o) in enumerate(rows):
        y, x = 20 + i * 40, float(left)
        out.append(f'<text x="8" y="{y + 16}" font-size="13">{_esc(label)}</text>')
        for b, seconds in o["buckets_s"].items():
            bw = width * seconds / o["wall_s"]
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{bw:.1f}" height="24" fill="{colour(b)}">'
                       f"<title>{_esc(b)}: {seconds / 3600:.1f} h ({seconds / o['wall_s']:.1%})</title></rect>")
            x += bw
        out.append(f'<text x="{left + width + 8}" y="{y + 17}" font-size="14" font-weight="bold">{o["goodput"]:.1%}</text>')
    y = 100
    out.append(f'<text x="8" y="{y + 16}" font-size="13">(c) Young/Daly optimum</text>'
               f'<rect x="{left}" y="{y}" width="{width * yd["goodput"]:.1f}" height="24" fill="{colour("productive")}"/>'
               f'<text x="{left + width + 8}" y="{y + 17}" font-size="14" font-weight="bold">{yd["goodput"]:.1%}</text>')
    lx = float(left)
    for b in doc["supervised"]["buckets_s"]:
        out.append(f'<rect x="{lx:.1f}" y="150" width="12" height="12" fill="{colour(b)}"/>'
                   f'<text x="{lx + 16:.1f}" y="160" font-size="12">{_esc(b)}</text>')
        lx += 30 + 7.5 * len(b)
    header = (f"<h2>{w['gpus']:,} GPUs for {w['days']:g} days: {w['faults']} faults (MTBF {w['mtbf_s'] / 3600:.2f} h), "
              f"seed {w['seed']}</h2><p>(c) uses the supervisor's stall &delta; = {yd['stall_s']:g} s and restart "
              f"R = {yd['restart_s']:g} s: 1 - sqrt(2&delta;/M) - R/M.</p>")  # fmt: skip
    return _page("supervise simulate", header, _W, 180, "".join(out))

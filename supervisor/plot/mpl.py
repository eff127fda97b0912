"""PNG/SVG pictures with matplotlib (the optional ``plot`` extra): a campaign's timeline, the simulator's comparison.

Imported only when a PNG or SVG is asked for; the Agg backend is used so no display is needed.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from supervisor.plot.timeline import BADPUT_COLOURS, Timeline, colour, end_of, place_labels, thinned
from supervisor.plot.timeline import duration as _duration


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _date(t: float) -> datetime:
    return datetime.fromtimestamp(t, tz=timezone.utc).replace(tzinfo=None)


def timeline(tl: Timeline, path: str) -> None:
    plt = _pyplot()
    import matplotlib.dates as mdates
    from matplotlib.patches import Patch

    nodes, lanes_title = tl.lane_nodes()
    lanes_h = max(1.2, 0.32 * len(nodes) + 0.6)
    fig = plt.figure(figsize=(13, 5.2 + lanes_h), layout="constrained")
    grid = fig.add_gridspec(3, 1, height_ratios=[3.6, lanes_h, 0.9])
    ax = fig.add_subplot(grid[0])
    lanes = fig.add_subplot(grid[1], sharex=ax)
    bar = fig.add_subplot(grid[2])
    ettr = "-" if tl.ettr is None else f"{tl.ettr:.1%}"
    fig.suptitle(f"campaign {tl.campaign or '?'}: {tl.state}; wall {_duration(tl.wall_s)}, ETTR {ettr}",
                 fontsize=12, x=0.01, ha="left")  # fmt: skip

    # Slurm runs as bands coloured by outcome, in the progress panel and the node lanes.
    outcomes = []
    for a in tl.attempts:
        for axis in (ax, lanes):
            axis.axvspan(_date(a.start), _date(end_of(a, tl)), color=colour(a.outcome or "running"), alpha=0.12, lw=0)
        outcomes.append(a.outcome or "running")
    if tl.progress:
        xs = [_date(t) for t, _ in tl.progress]
        ax.plot(xs, [s for _, s in tl.progress], color="#1e3a5f", lw=1.8, label="step reached")
        # extend each launch's line to where it ended
        last_t, last_s = tl.progress[-1]
        end = max(last_t, max((end_of(x, tl) for x in tl.launches), default=last_t))
        ax.plot([_date(last_t), _date(end)], [last_s, last_s], color="#1e3a5f", lw=1.8)
    ticks, every = thinned(tl.checkpoints)
    if ticks:
        what = "checkpoint committed" if every == 1 else f"checkpoints committed (every {every}th of {len(tl.checkpoints)})"
        ax.plot([_date(t) for t, _ in ticks], [s for _, s in ticks], linestyle="none", marker="|", markersize=12,
                color="#5e35b1", label=what)  # fmt: skip
    top = max([s for _, s in tl.progress] + [s for _, s in tl.checkpoints] + [1])
    ax.set_ylim(0, top * 1.42)
    span = max(tl.t1 - tl.t0, 1e-9)
    labels = [m.cls + (f" ({', '.join(m.blamed[:2])})" if m.blamed else "") for m in tl.interruptions]
    rows = place_labels([(m.t - tl.t0) / span for m in tl.interruptions], [0.0064 * len(x) + 0.008 for x in labels])
    for m, text, (row, anchor) in zip(tl.interruptions, labels, rows, strict=True):
        ax.axvline(_date(m.t), color=colour(m.cls), lw=1.2, ls="--")
        if row is None:
            continue  # no room: the line's colour still tells the class (legend)
        ax.annotate(text, (_date(m.t), top * (1.39 - 0.075 * row)), fontsize=8, color=colour(m.cls),
                    ha="right" if anchor == "end" else "left", va="top",
                    xytext=(-3 if anchor == "end" else 3, 0), textcoords="offset points",
                    bbox={"boxstyle": "round,pad=0.12", "fc": "white", "ec": "none", "alpha": 0.85})  # fmt: skip
    for cls in dict.fromkeys(m.cls for m in tl.interruptions):
        ax.plot([], [], color=colour(cls), ls="--", lw=1.2, label=f"interruption: {cls}")
    if any(launch.blamed for launch in tl.launches):
        ax.plot([], [], marker="X", color="black", linestyle="none", label="blamed node (lanes below)")
    ax.set_ylabel("training step")
    handles, _ = ax.get_legend_handles_labels()
    handles += [Patch(color=colour(o), alpha=0.35, label=f"run ended: {o}") for o in dict.fromkeys(outcomes)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    ax.tick_params(labelbottom=False)

    # Node lanes: where each launch ran (coloured by how it ended), and the node that was blamed.
    index = {n: i for i, n in enumerate(nodes)}
    for launch in tl.launches:
        x0, x1 = mdates.date2num(_date(launch.start)), mdates.date2num(_date(end_of(launch, tl)))
        for n in (n for n in launch.nodes if n in index):
            lanes.broken_barh([(x0, max(x1 - x0, 1e-9))], (index[n] - 0.35, 0.7),
                              color=colour(launch.outcome or "running"), alpha=0.85)  # fmt: skip
        for n in (n for n in launch.blamed if n in index):
            lanes.plot([_date(end_of(launch, tl))], [index[n]], marker="X", markersize=11, color="black",
                       linestyle="none")  # fmt: skip
    lanes.set_yticks(range(len(nodes)), nodes, fontsize=8)
    lanes.set_ylim(-0.7, max(len(nodes), 1) - 0.3)
    lanes.invert_yaxis()
    lanes.set_ylabel(lanes_title)
    locator = mdates.AutoDateLocator(minticks=4, maxticks=10)
    lanes.xaxis.set_major_locator(locator)
    concise = mdates.ConciseDateFormatter(locator)
    concise.formats[5] = "%H:%M:%S"  # ticks seconds apart: the clock time, not a bare "30" next to "11:41"
    lanes.xaxis.set_major_formatter(concise)
    lanes.set_xlabel("wall clock (UTC)")

    _split_bar(bar, tl.goodput, tl.wall_s)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _split_bar(ax: Any, parts: list[tuple[str, float]], wall: float) -> None:
    wall = wall or sum(s for _, s in parts) or 1.0
    left = 0.0
    for name, seconds in parts:
        share = seconds / wall
        ax.barh(0, share, left=left, color=BADPUT_COLOURS.get(name, "#bdbdbd"), edgecolor="white",
                label=f"{name} {share:.1%} ({_duration(seconds)})")  # fmt: skip
        left += share
    ax.set_xlim(0, 1)
    ax.set_yticks([])
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    ax.set_title("where the wall clock went", fontsize=10, loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncols=min(5, max(1, len(parts))), fontsize=8,
              frameon=False)  # fmt: skip


def comparison(doc: dict[str, Any], path: str) -> None:
    """The simulator's (a)/(b)/(c) as stacked bars of the wall clock, labelled with their goodput."""
    plt = _pyplot()
    w = doc["world"]
    rows = [("(a) naive Slurm requeue", doc["naive"]), ("(b) this supervisor", doc["supervised"])]
    fig, ax = plt.subplots(figsize=(12, 4.2), layout="constrained")
    buckets = list(doc["supervised"]["buckets_s"])
    for y, (_label, out) in enumerate(rows):
        left, wall = 0.0, out["wall_s"]
        for b in buckets:
            share = out["buckets_s"][b] / wall
            ax.barh(y, share, left=left, color=BADPUT_COLOURS.get(b, "#bdbdbd"), edgecolor="white",
                    label=b if y == 0 else None)  # fmt: skip
            left += share
        ax.text(1.01, y, f"{out['goodput']:.1%}", va="center", fontsize=11, fontweight="bold")
    yd = doc["young_daly"]
    ax.barh(2, yd["goodput"], color=BADPUT_COLOURS["productive"], edgecolor="white", hatch="//")
    ax.barh(2, 1 - yd["goodput"], left=yd["goodput"], color="#eeeeee", edgecolor="white")
    ax.text(1.01, 2, f"{yd['goodput']:.1%}", va="center", fontsize=11, fontweight="bold")
    ax.set_yticks([0, 1, 2], [r[0] for r in rows] + [f"(c) Young/Daly optimum (δ={yd['stall_s']:g} s, R={yd['restart_s']:g} s)"])
    ax.invert_yaxis()
    ax.set_xlim(0, 1.08)
    ax.xaxis.set_major_formatter(lambda v, _: f"{v:.0%}" if v <= 1 else "")
    ax.set_xlabel("share of the wall clock")
    ax.set_title(f"{w['gpus']:,} GPUs for {w['days']:g} days, {w['faults']} faults (MTBF {w['mtbf_s'] / 3600:.2f} h), "
                 f"seed {w['seed']}", fontsize=11, loc="left")  # fmt: skip
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncols=len(buckets), fontsize=9, frameon=False)
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""What a campaign picture shows: a view of the journal's one fold (``TimelineView``). Pure.

The journal is the one source: ``attempt_started``/``attempt_ended`` give the Slurm runs (bands coloured by
outcome), ``step_launched`` each launch and its nodes (node lanes) and the step it resumed from, ``interruption``
the class, the blamed nodes and the last step reached, ``checkpoint_committed`` the checkpoints (ticks).
Progress is drawn through (time, step) points: a launch resumes at its checkpoint's step, so a drop in the
line is work that was lost. The goodput split comes from ``report.fold`` (its public contract).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.decisions import events as ev

COLOURS = {
    "completed": "#2e7d32", "preemption": "#6d8fb3", "timeout": "#8e7cc3", "cancelled": "#9e9e9e",
    "node_failure": "#c62828", "hardware": "#ad1457", "hang": "#ef6c00", "comm_error": "#f9a825",
    "app_error": "#6a1b9a", "numerical": "#00838f", "unknown": "#757575", "running": "#64b5f6",
}  # fmt: skip
BADPUT_COLOURS = {"productive": "#43a047", "lost_work": "#e57373", "restart": "#ffb74d", "checkpoint": "#9575cd",
                  "queue": "#90a4ae", "detection": "#f06292", "preflight": "#4db6ac", "operator": "#a1887f",
                  "slow_steps": "#aed581", "teardown": "#ff8a65", "other": "#d7d7d7"}  # fmt: skip


def colour(name: str) -> str:
    return COLOURS.get(name) or BADPUT_COLOURS.get(name) or "#757575"


@dataclass
class Span:
    """A Slurm run (attempt) or one launch of the training step, from ``start`` to ``end``."""

    start: float
    end: float | None
    outcome: str | None = None  # interruption class, None while running
    label: str = ""
    nodes: tuple[str, ...] = ()
    blamed: tuple[str, ...] = ()
    evidence: str = ""


@dataclass(frozen=True)
class Mark:
    t: float
    cls: str
    blamed: tuple[str, ...]
    text: str


@dataclass
class Timeline:
    campaign: str
    state: str
    t0: float
    t1: float
    attempts: list[Span] = field(default_factory=list)
    launches: list[Span] = field(default_factory=list)
    progress: list[tuple[float, int]] = field(default_factory=list)  # (t, step), a drop is lost work
    interruptions: list[Mark] = field(default_factory=list)  # the non-completed ones
    checkpoints: list[tuple[float, int]] = field(default_factory=list)
    goodput: list[tuple[str, float]] = field(default_factory=list)  # (bucket, seconds), productive first
    wall_s: float = 0.0

    @property
    def nodes(self) -> list[str]:
        return sorted({n for launch in self.launches for n in launch.nodes} | {n for m in self.interruptions
                                                                                for n in m.blamed})  # fmt: skip

    def lane_nodes(self, limit: int = 40) -> tuple[list[str], str]:
        """The nodes to draw a lane for, and the lanes' title: all of them, or on a big job the blamed ones."""
        nodes = self.nodes
        if len(nodes) <= limit:
            return nodes, "nodes"
        blamed = sorted({n for m in self.interruptions for n in m.blamed})[:limit]
        return blamed, f"blamed nodes ({len(blamed)} of {len(nodes)})"

    @property
    def ettr(self) -> float | None:
        productive = dict(self.goodput).get("productive")
        return None if productive is None or self.wall_s <= 0 else productive / self.wall_s


def _step(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class TimelineView:
    """The timeline as a view of the journal's one fold: ``campaign_state.fold(events, views=[view])`` feeds it
    every event, then :meth:`timeline` closes the picture at ``now``."""

    def __init__(self) -> None:
        self.tl = Timeline("", "pending", math.inf, -math.inf)
        self.attempt: Span | None = None
        self.launch: Span | None = None
        self.last_step = 0
        self.ended = False

    def apply(self, e: Mapping[str, Any]) -> None:
        raw_t, kind = e.get("t"), e.get("type")
        if not isinstance(raw_t, (int, float)) or isinstance(raw_t, bool):
            return
        t, tl, launch = float(raw_t), self.tl, self.launch
        tl.t0, tl.t1 = min(tl.t0, t), max(tl.t1, t)
        if kind == ev.CAMPAIGN_STARTED:
            tl.campaign = str(e.get("campaign") or "")
        elif kind == ev.ATTEMPT_STARTED:
            self.attempt = Span(t, None, label=f"job {e.get('job_id')} run {e.get('restart', 0)}",
                                nodes=tuple(e.get("nodes") or ()))  # fmt: skip
            tl.attempts.append(self.attempt)
            tl.state = "running"
        elif kind == ev.STEP_LAUNCHED:
            if launch is not None and launch.end is None:
                launch.end = t
            step = _step(e.get("resume_step")) or 0
            self.launch = Span(t, None, label=f"launch {e.get('launch')}", nodes=tuple(e.get("nodes") or ()))
            tl.launches.append(self.launch)
            if tl.progress:  # no progress while down, then the rewind to the resumed checkpoint
                tl.progress.append((t, tl.progress[-1][1]))
            tl.progress.append((t, step))
            self.last_step = step
        elif kind == ev.CHECKPOINT_COMMITTED and _step(e.get("step")) is not None:
            tl.checkpoints.append((t, int(e["step"])))
            if launch is not None and launch.end is None and int(e["step"]) >= self.last_step:
                self.last_step = int(e["step"])
                tl.progress.append((t, self.last_step))
        elif kind == ev.INTERRUPTION:
            self._interruption(t, e)
        elif kind == ev.ATTEMPT_ENDED:
            self._attempt_ended(t, e.get("outcome") or {})
        elif kind == ev.CAMPAIGN_ENDED:
            tl.state = str(e.get("state", tl.state))
            self.ended = True

    def _interruption(self, t: float, e: Mapping[str, Any]) -> None:
        cls = str(e.get("class", ev.UNKNOWN))
        blamed = tuple(e.get("blamed_nodes") or ())
        evidence = "; ".join(str(x) for x in (e.get("evidence") or [])[:2])
        reached, launch = _step(e.get("last_step")), self.launch
        if reached is not None and launch is not None and launch.end is None:
            self.last_step = max(self.last_step, reached)
            self.tl.progress.append((t, self.last_step))
        if launch is not None and launch.end is None:
            launch.end, launch.outcome, launch.blamed, launch.evidence = t, cls, blamed, evidence
        if cls != ev.COMPLETED:
            self.tl.interruptions.append(Mark(t, cls, blamed, evidence))

    def _attempt_ended(self, t: float, outcome: Mapping[str, Any]) -> None:
        cls = str(outcome.get("class", ev.UNKNOWN))
        launch, attempt = self.launch, self.attempt
        if launch is not None and launch.end is None:
            launch.end, launch.outcome = t, cls
            launch.blamed = tuple(outcome.get("blamed_nodes") or ())
        if attempt is not None and attempt.end is None:
            attempt.end, attempt.outcome = t, cls
            attempt.blamed = tuple(outcome.get("blamed_nodes") or ())
            attempt.evidence = "; ".join(str(x) for x in (outcome.get("evidence") or [])[:2])
        self.tl.state = "pending"

    def timeline(self, now: float, goodput: Mapping[str, Any] | None = None) -> Timeline:
        """The picture as of ``now``; ``goodput``: the report's ``goodput`` object (wall_s, productive_s, badput_s)
        for the split bar."""
        tl = copy.deepcopy(self.tl)
        if tl.t0 == math.inf:  # no events yet
            tl.t0 = tl.t1 = now
        tl.t1 = max(tl.t1, tl.t0 + 1.0)
        if not self.ended:
            tl.t1 = max(tl.t1, now)
        for span in (*tl.attempts, *tl.launches):  # still running: draw up to the end of the picture
            if span.end is None and span.outcome is None:
                span.outcome = "running"
        if goodput:
            tl.wall_s = float(goodput.get("wall_s") or 0.0)
            tl.goodput = [("productive", float(goodput.get("productive_s") or 0.0))] + [
                (str(k), float(v)) for k, v in (goodput.get("badput_s") or {}).items() if float(v or 0) > 0
            ]
        return tl


def build(events: Iterable[Mapping[str, Any]], now: float, goodput: Mapping[str, Any] | None = None) -> Timeline:
    """The timeline of a journal: its one fold with a :class:`TimelineView` fed in the same pass."""
    from supervisor.decisions import campaign_state

    view = TimelineView()
    campaign_state.fold(events, views=(view,))
    return view.timeline(now, goodput)


def duration(seconds: float) -> str:
    """A length of wall clock for a label: seconds, minutes or hours."""
    if seconds >= 7200:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.1f} s"


def end_of(span: Span, tl: Timeline) -> float:
    return span.end if span.end is not None else tl.t1


def thinned(points: list[tuple[float, int]], limit: int = 60) -> tuple[list[tuple[float, int]], int]:
    """At most about ``limit`` checkpoint ticks (every n-th, and the last): a long campaign has thousands."""
    if len(points) <= limit:
        return points, 1
    every = math.ceil(len(points) / limit)
    kept = points[::every]
    if kept[-1] != points[-1]:
        kept.append(points[-1])
    return kept, every


def place_labels(xs: list[float], widths: list[float], rows: int = 4, gap: float = 0.004
                 ) -> list[tuple[int | None, str]]:  # fmt: skip
    """Rows for interruption labels (x and widths as fractions of the plot width, in time order) so that no two
    overlap and none leaves the plot: each is (row or None when there is no room, "end" or "start" anchor)."""
    ends = [-1.0] * rows
    placed: list[tuple[int | None, str]] = []
    for x, w in zip(xs, widths, strict=True):
        lo, hi, anchor = (x - w, x, "end") if x - w >= 0 else (x, x + w, "start")
        if hi > 1.0:
            placed.append((None, anchor))
            continue
        row = next((r for r in range(rows) if lo > ends[r] + gap), None)
        if row is not None:
            ends[row] = hi
        placed.append((row, anchor))
    return placed

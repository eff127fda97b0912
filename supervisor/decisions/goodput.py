"""The exact goodput ledger: every millisecond of a campaign in exactly one bucket. Pure fold of the journal.

Inputs are journal events only: the supervisor's decisions (``attempt_started``, ``step_launched``,
``interruption``, ``attempt_ended``, ``campaign_ended``, hang ``detection``\\s) and the per-rank records the loop
journals from the heartbeat table (``step_progress``: the slowest reporting rank's step and when it reached it;
``checkpoint_stall``: the time ranks spent in the checkpoint phase, measured by the client). docs/goodput.md,
"The ledger", states the rules; in short, inside one launch (one srun, a row of ``report``'s ``attempts``):

- ``restart`` (start-up): launch to its first step (process start, restore, first step), and a Slurm run's start
  to its first launch (supervisor and agents starting);
- productive / ``slow_steps`` / ``lost_work``: first step to last step, minus checkpoint stalls; kept up to the
  step the next launch resumed from (or all of it for the final state), lost after it; the kept steps cost
  ``ideal step time`` each (the ml-goodput way: the mean of the step times ≤ median + 3·MAD), the rest of the
  kept time is ``slow_steps``;
- ``checkpoint``: the checkpoint stalls (slowest rank), wherever they fall;
- ``detection``: last step to the interruption's decision; ``teardown``: the decision to the next launch or the
  end of the Slurm run (and the end of a completed run); ``queue``: a Slurm run's end to the next one's start;
  ``preflight``: node checks journaled with their duration; ``other``: time nothing explains (a supervisor that
  died without a word, until the next run started).

Times are the journal's wall clock in integer milliseconds; a clock that steps back is clamped (no time is
negative, none is created), one that steps forward lengthens the bucket that was open. Journals written before
the per-rank records existed fall back to an estimate (steps spread evenly between launch and last step).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.decisions import events as ev

Event = Mapping[str, Any]
BUCKETS: tuple[str, ...] = ("productive", "slow_steps", "lost_work", "checkpoint", "detection", "teardown", "queue",
                            "restart", "preflight", "other")  # fmt: skip
BADPUT: tuple[str, ...] = BUCKETS[1:]
HANG_DETECTIONS = ("rank_hang", "global_stall", "rank_stopped")
# How a launch followed the interrupted one: restarted in the ranks' processes (a warm restart), a new srun in the
# same Slurm run, or the first launch of a new Slurm run (a requeue).
RESTART_KINDS = ("warm", "relaunch", "requeue")
PREFLIGHT = ev.PREFLIGHT  # node checks before a launch, journaled with their ``duration_s``
_COMPUTE = "compute"  # a piece of a launch between first and last step: always covered by kept/lost


@dataclass
class _Launch:
    row: int
    start: int
    resume_step: int | None
    points: list[tuple[int, int]] = field(default_factory=list)  # (ms, step) from step_progress
    stalls: dict[int, tuple[int, int]] = field(default_factory=dict)  # step -> (end ms, stall ms)
    ended: int | None = None  # ms of the interruption (or the run's end) that closed it
    cls: str | None = None
    last_step: int | None = None
    hang_ms: int = 0
    best_ckpt: int | None = None  # newest committed checkpoint when it ended
    how: str = "relaunch"  # how it started after the launch before it: RESTART_KINDS


def _ms(t: Any) -> int:
    return round(float(t) * 1000)


def _int(x: Any) -> int | None:
    """A step or count as the journal holds it, or None (a wrong type, or beyond any real step: an int of 400
    digits would overflow every float it meets)."""
    return x if isinstance(x, int) and not isinstance(x, bool) and abs(x) < 1 << 62 else None


class _Fold:
    def __init__(self) -> None:
        self.start: int | None = None
        self.now = 0  # the effective clock: never goes back
        self.launches: list[_Launch] = []
        self.base: list[tuple[int, int, str, int, int | None]] = []  # (start, end, label, row, cause)
        self.state, self.since, self.row = "queue", 0, -1
        self.cause: int | None = None
        self.last_event = 0
        self.ended_at: int | None = None
        self.best_ckpt: int | None = None
        self.preflight: list[tuple[int, int, int, int | None]] = []  # (end ms, ms, row, cause)

    @property
    def open_launch(self) -> _Launch | None:
        return self.launches[-1] if self.state == "launch" and self.launches else None

    def _enter(self, state: str, row: int, cause: int | None) -> None:
        if self.now > self.since:
            self.base.append((self.since, self.now, self.state, self.row, self.cause))
        self.state, self.since, self.row, self.cause = state, self.now, row, cause

    def _close_launch(self, cls: str, last_step: Any = None) -> None:
        launch = self.open_launch
        if launch is not None:
            launch.ended, launch.cls = self.now, cls
            launch.last_step = _int(last_step) if _int(last_step) is not None else launch.last_step
            launch.best_ckpt = self.best_ckpt

    def apply(self, e: Event) -> None:
        kind = e.get("type")
        if kind in ev.STORAGE_EVENT_TYPES or "t" not in e:
            return
        t = _ms(e["t"])
        if self.start is None:
            self.start = self.since = self.now = self.last_event = t
        prev_event, self.now = self.last_event, max(self.now, t)
        self.last_event = self.now
        if self.ended_at is not None:
            return  # nothing after the campaign's end counts (a later resubmission starts a new campaign)
        launch = self.launches[-1] if self.launches else None
        current = launch is not None and launch.ended is None
        lasting = self.state in ("launch", "teardown")  # records of a launch still come after its interruption
        if kind == ev.ATTEMPT_STARTED:
            if self.state == "launch" and launch is not None:  # the previous run ended without a word
                self.now, keep = prev_event, self.now
                self._close_launch(ev.UNKNOWN)
                self._enter("other", launch.row, launch.row)
                self.now = keep
            elif self.state == "restart":  # a run that never launched, then another
                self._enter("other", self.row, self.cause)
            cause = self.launches[-1].row if self.launches else None
            self._enter("restart", self.row, cause)
        elif kind == ev.STEP_LAUNCHED:
            if self.state == "launch":
                self._close_launch(ev.UNKNOWN)
            row = len(self.launches)
            how = "warm" if e.get("generation") is not None else "requeue" if self.state == "restart" else "relaunch"
            self.launches.append(_Launch(row, self.now, _int(e.get("resume_step")), how=how))
            self._enter("launch", row, row - 1 if row else None)
        elif kind == ev.INTERRUPTION:
            if self.state == "launch":
                self._close_launch(str(e.get("class", ev.UNKNOWN)), e.get("last_step"))
                self._enter("teardown", self.row, self.row)
        elif kind == ev.ATTEMPT_ENDED:
            outcome = e.get("outcome") or {}
            if self.state == "launch":
                self._close_launch(str(outcome.get("class", ev.UNKNOWN)), e.get("last_step"))
            cause = self.launches[-1].row if self.launches else None
            self._enter("queue", self.row, cause)
        elif kind == ev.CAMPAIGN_ENDED:
            if self.state == "launch":
                self._close_launch(ev.COMPLETED if e.get("state") == "completed" else ev.UNKNOWN)
            self._enter("ended", self.row, None)
            self.ended_at = self.now
        elif kind == ev.DETECTION and e.get("kind") in HANG_DETECTIONS and current and launch is not None:
            launch.hang_ms = max(launch.hang_ms, _ms(e.get("duration_s") or 0.0))
        elif kind == ev.STEP_PROGRESS and lasting and launch is not None and _int(e.get("step")) is not None:
            step_t = min(self.now, max(launch.start, _ms(e.get("step_t", e["t"]))))
            launch.points.append((step_t, e["step"]))
        elif kind == ev.CHECKPOINT_STALL and lasting and launch is not None and _int(e.get("step")) is not None:
            end = min(self.now, max(launch.start, _ms(e.get("end_t", e["t"]))))
            stall = max(0, _ms(e.get("stall_s") or 0.0))
            old = launch.stalls.get(e["step"])
            if old is None or stall > old[1]:  # one checkpoint seen on two passes: the slowest rank's stall
                launch.stalls[e["step"]] = (end, stall)
        elif kind == PREFLIGHT and _ms(e.get("duration_s") or 0.0) > 0:
            self.preflight.append((self.now, _ms(e["duration_s"]), self.row, self.cause))
        elif kind == ev.CHECKPOINT_COMMITTED and _int(e.get("step")) is not None:
            self.best_ckpt = max(self.best_ckpt or 0, e["step"])

    def finish(self, now: float) -> int:
        end = self.ended_at if self.ended_at is not None else max(self.now, _ms(now))
        self.now = end
        if self.state != "ended":
            self._enter("ended", self.row, None)
        return end


@dataclass(frozen=True)
class _Interval:
    start: int
    end: int
    prio: int
    label: str
    row: int
    cause: int | None


def _points(launch: _Launch, end: int, measured: bool) -> list[tuple[int, int]]:
    """The launch's (ms, step) progress, stalls included, monotone in both; a fallback when none was journaled."""
    pts = list(launch.points)
    for step, (stop, stall) in launch.stalls.items():
        pts += [(stop - stall, step), (stop, step)]
    if not pts and not measured:  # no per-rank records in the whole campaign (no client, or an old journal)
        first = launch.resume_step or 0  # steps spread evenly from the launch to the last step
        stop = end if launch.ended is None else max(launch.start, launch.ended - launch.hang_ms)
        if stop > launch.start:
            pts = [(launch.start, first), (stop, max(first, launch.last_step or first))]
    pts.sort()
    out: list[tuple[int, int]] = []
    for t, s in pts:
        t = min(max(t, launch.start), end)
        s = max(s, out[-1][1]) if out else s
        out.append((t, s))
    return out


def _time_of_step(pts: list[tuple[int, int]], step: int) -> int:
    """When ``step`` was reached (linear between the two records around it)."""
    if step <= pts[0][1]:
        return pts[0][0]
    for (t1, s1), (t2, s2) in zip(pts, pts[1:], strict=False):
        if s1 < step <= s2:
            return t1 + round((t2 - t1) * (step - s1) / (s2 - s1))
    return pts[-1][0]


def _kept_step(f: _Fold, i: int, pts: list[tuple[int, int]]) -> int:
    """The step up to which launch ``i``'s work was kept: where the next launch resumed (or will resume)."""
    launch = f.launches[i]
    nxt = f.launches[i + 1] if i + 1 < len(f.launches) else None
    if nxt is None and launch.cls in (None, ev.COMPLETED):
        return pts[-1][1]  # the final state (or a launch still running) keeps everything
    if nxt is not None and nxt.resume_step is not None:
        return nxt.resume_step
    if nxt is not None and nxt.points:
        return min(nxt.points)[1] - 1  # the program resumed by itself: its first step says from where
    if nxt is not None and launch.best_ckpt is None:
        return 0
    return launch.best_ckpt if launch.best_ckpt is not None else pts[-1][1]  # not relaunched yet: the newest


def ideal_step_ms(samples: Iterable[tuple[float, int]]) -> float | None:
    """ml-goodput's ideal step time: the mean of the step times ≤ median + 3·MAD. ``samples``: (mean step time
    over a stretch, steps in it); each stretch counts as that many steps."""
    pts = sorted((x, w) for x, w in samples if w > 0)
    if not pts:
        return None

    def wmedian(values: list[tuple[float, int]]) -> float:
        total, acc = sum(w for _, w in values), 0
        for x, w in values:
            acc += w
            if 2 * acc >= total:
                return x
        return values[-1][0]

    med = wmedian(pts)
    mad = wmedian(sorted((abs(x - med), w) for x, w in pts))
    keep = [(x, w) for x, w in pts if x <= med + 3 * mad]
    return sum(x * w for x, w in keep) / sum(w for _, w in keep)


def _stall_overlap(stalls: list[tuple[int, int]], a: int, b: int) -> int:
    return sum(max(0, min(b, stop) - max(a, stop - ms)) for stop, ms in stalls)


def _step_samples(launch: _Launch, pts: list[tuple[int, int]]) -> list[tuple[float, int]]:
    """(mean step time, steps) per stretch between two journaled progress records, less the checkpoint stalls taken
    in it: a stall at step k (k the last step done when it was saved) lies between the records around k and k+1.

    Not the stall-augmented ``pts``: a stall's end is when the supervisor saw it, often the very time of the next
    progress record, which made stretches of several steps in 0 s (a 0.3 s step program got a 0.286 s ideal on a
    loaded machine). Without progress records (old journals), ``pts`` and the stalls' time overlap."""
    if len(launch.points) < 2:
        stalls = list(launch.stalls.values())
        return [((t2 - t1 - _stall_overlap(stalls, t1, t2)) / (s2 - s1), s2 - s1)
                for (t1, s1), (t2, s2) in zip(pts, pts[1:], strict=False) if s2 > s1]  # fmt: skip
    out = []
    for (t1, s1), (t2, s2) in zip(launch.points, launch.points[1:], strict=False):
        if s2 > s1 and t2 >= t1:
            stalled = sum(ms for step, (_, ms) in launch.stalls.items() if s1 <= step < s2)
            out.append((max(0, t2 - t1 - stalled) / (s2 - s1), s2 - s1))
    return out


def ledger(events: Iterable[Event], now: float) -> dict[str, Any]:
    """The ledger of a campaign: ``buckets_ms`` (campaign), ``rows`` (per launch: span and buckets), ``by_class``
    (interruption class -> count and buckets it caused), ``by_restart`` (the same by how the next launch came back,
    :data:`RESTART_KINDS`: a warm restart's ``teardown`` is the survivors' release and the order, its ``restart``
    the rendezvous, state load and first step), ``ideal_step_s``. All times in integer ms."""
    f = _Fold()
    for e in events:
        try:
            f.apply(e)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError):
            continue  # a field of the wrong type (a bug, a hand edit): that event is skipped, never the report
    if f.start is None:
        return {"wall_ms": 0, "buckets_ms": dict.fromkeys(BUCKETS, 0), "rows": [], "pre_launch_ms": {},
                "by_class": {}, "by_restart": {}, "ideal_step_s": None, "causes": {}}  # fmt: skip
    end = f.finish(now)
    ivs: list[_Interval] = []
    spans = []
    geometry: list[tuple[list[tuple[int, int]], int | None, int | None, int]] = []
    measured = any(launch.points or launch.stalls for launch in f.launches)
    tails: list[int] = []  # a running launch's time since its last record: productive until seen otherwise
    for i, launch in enumerate(f.launches):
        nxt_start = f.launches[i + 1].start if i + 1 < len(f.launches) else end
        spans.append((launch.start, nxt_start))
        pts = _points(launch, nxt_start, measured)
        first, last, keep_t, steps, tail = None, None, None, 0, 0
        if pts:
            first, last = pts[0][0], pts[-1][0]
            kept_step = _kept_step(f, i, pts)
            keep_t = min(last, _time_of_step(pts, kept_step))
            steps = max(0, kept_step - pts[0][1])
            if pts[-1][1] == pts[0][1] and not measured:  # not even a last step: nothing says work was lost
                keep_t, steps = last, -1
            if launch.ended is None and i == len(f.launches) - 1:
                tail = max(0, nxt_start - last)  # still running: computing until now (steps not seen yet)
                last = keep_t = nxt_start
            ivs.append(_Interval(first, keep_t, 1, "kept", i, None))
            ivs.append(_Interval(keep_t, last, 1, "lost_work", i, i))
        for stop, ms in launch.stalls.values():
            ivs.append(_Interval(max(launch.start, stop - ms), min(stop, nxt_start), 2, "checkpoint", i, None))
        geometry.append((pts, first, last, steps))
        tails.append(tail)
    for stop, ms, row, cause in f.preflight:  # inside the row it was journaled in
        lo, hi = spans[row] if row >= 0 else (f.start, f.launches[0].start if f.launches else end)
        ivs.append(_Interval(max(lo, stop - ms), min(hi, stop), 2, PREFLIGHT, row, cause))
    for a, b, state, row, cause in f.base:
        if state == "launch":
            launch = f.launches[row]
            _, first, last, _ = geometry[row]
            if first is None or last is None:
                ivs.append(_Interval(a, b, 0, "restart", row, cause))
                continue
            after = "teardown" if launch.cls == ev.COMPLETED else "detection"
            for lo, hi, label, c in ((a, min(b, first), "restart", cause), (max(a, first), min(b, last), _COMPUTE, row),
                                     (max(a, last), b, after, row)):  # fmt: skip
                if hi > lo:
                    ivs.append(_Interval(lo, hi, 0, label, row, c))
        elif state != "ended":
            ivs.append(_Interval(a, b, 0, state, row, cause))
    rows = [dict.fromkeys(("kept", *BUCKETS[2:]), 0) for _ in f.launches]
    pre: dict[str, int] = {}
    causes: dict[int, dict[str, int]] = {}
    for lo, hi, iv in _paint(ivs):
        label = "other" if iv.label == _COMPUTE else iv.label
        target = rows[iv.row] if iv.row >= 0 else pre
        target[label] = target.get(label, 0) + hi - lo
        if iv.cause is not None and label not in ("kept", "checkpoint"):
            by = causes.setdefault(iv.cause, {})
            by[label] = by.get(label, 0) + hi - lo
    # productive vs slow steps: the kept steps at the ideal step time
    samples: list[tuple[float, int]] = []
    for launch, (pts, *_rest) in zip(f.launches, geometry, strict=True):
        samples += _step_samples(launch, pts)
    ideal = ideal_step_ms(samples)
    totals = dict.fromkeys(BUCKETS, 0)
    out_rows = []
    for i, row_ms in enumerate(rows):
        kept = row_ms.pop("kept", 0)
        steps = geometry[i][3]
        if ideal is None or steps < 0:  # -1: steps unknown
            productive = kept
        else:
            productive = min(kept - tails[i], round(steps * ideal)) + tails[i]
        buckets = {"productive": productive, "slow_steps": kept - productive, **row_ms}
        for k, v in buckets.items():
            totals[k] += v
        out_rows.append({"span_ms": spans[i], "buckets_ms": {k: buckets.get(k, 0) for k in BUCKETS},
                         "kept_steps": max(0, steps), "class": f.launches[i].cls})  # fmt: skip
    for k, v in pre.items():
        totals[k] += v
    totals["other"] += (end - f.start) - sum(totals.values())  # 0 while the base tiles the campaign (it does)
    by_class: dict[str, dict[str, Any]] = {}
    for i, launch in enumerate(f.launches):
        if launch.cls is None or launch.cls not in ev.RESTART_CLASSES:
            continue
        entry = by_class.setdefault(launch.cls, {"count": 0, "buckets_ms": {}})
        entry["count"] += 1
        for k, v in causes.get(i, {}).items():
            entry["buckets_ms"][k] = entry["buckets_ms"].get(k, 0) + v
    by_restart: dict[str, dict[str, Any]] = {}  # the same costs by how the training came back
    for i, launch in enumerate(f.launches[:-1]):
        if launch.cls is None or launch.cls not in ev.RESTART_CLASSES:
            continue
        entry = by_restart.setdefault(f.launches[i + 1].how, {"count": 0, "buckets_ms": {}})
        entry["count"] += 1
        for k, v in causes.get(i, {}).items():
            entry["buckets_ms"][k] = entry["buckets_ms"].get(k, 0) + v
    return {"wall_ms": end - f.start, "buckets_ms": totals, "rows": out_rows, "pre_launch_ms": pre,
            "by_class": by_class, "by_restart": by_restart,
            "ideal_step_s": None if ideal is None else round(ideal / 1000, 6)}  # fmt: skip


def _paint(ivs: list[_Interval]) -> list[tuple[int, int, _Interval]]:
    """Cut the intervals into pieces, each given to the highest-priority interval covering it (ties: the later)."""
    ivs = [iv for iv in ivs if iv.end > iv.start]
    bounds = sorted({b for iv in ivs for b in (iv.start, iv.end)})
    order = sorted(range(len(ivs)), key=lambda k: ivs[k].start)
    heap: list[tuple[int, int, int]] = []  # (-prio, -index, index)
    out: list[tuple[int, int, _Interval]] = []
    j = 0
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        while j < len(order) and ivs[order[j]].start <= lo:
            k = order[j]
            heapq.heappush(heap, (-ivs[k].prio, -k, k))
            j += 1
        while heap and ivs[heap[0][2]].end <= lo:
            heapq.heappop(heap)
        if not heap:
            continue  # cannot happen while base intervals tile the campaign; then "other" is the remainder
        # lazily drop ended intervals under the top too: the top is the best live one
        out.append((lo, hi, ivs[heap[0][2]]))
    return out


def to_seconds(ms: Mapping[str, int]) -> dict[str, float]:
    return {k: round(v / 1000, 3) for k, v in ms.items()}

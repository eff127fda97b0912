"""How long each recovery took, phase by phase, from the journal. Pure.

WHY: the goodput ledger says how much time recoveries cost in all (``by_restart``); whoever compares warm restarts
with relaunches, or looks for what to shorten, needs each recovery's phases. Every figure is the supervisor's own
clock between events it journaled (a rank's first step: the time that rank reported for it), so nothing here
depends on the program's cooperation beyond ``client.step``:

- ``verdict_s``: the first detection of the failed launch until the interruption was decided (None when nothing
  was detected before the step ended: a rank's exit is seen as the step's end);
- ``teardown_s``: the interruption until the training was under way again: for a warm restart the survivors'
  release (``release_s``: every one left the failed collective and waits) and the restart order (``order_s``:
  sent until every kept rank took it, as the agents' reports show it, so up to a report late; a first step
  before that cuts it there: the order was taken by then); for a relaunch the step's end and the new srun; for a
  requeue the queue too;
- ``up_s``: from there to the first step the new launch reported: for a warm restart the rendezvous, the state
  load and the first step in the kept processes; cold, the processes' start (interpreter, imports) as well;
- ``restore_s``: the part of ``up_s`` the slowest rank spent loading its state, measured by the ranks' clients
  around ``phase("restore")`` (the memory tier's ``restore`` marks its own); None when no rank marked one. The
  rest of ``up_s`` is the rendezvous, the model's build and the first step (cold: the processes' start too);
- ``total_s``: the first detection (else the interruption) until that first step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from supervisor.decisions import events as ev

Event = Mapping[str, Any]
RECOVERY_EVENTS = frozenset({ev.ATTEMPT_STARTED, ev.STEP_LAUNCHED, ev.DETECTION, ev.INTERRUPTION,
                             ev.WARM_RESTART_ORDERED, ev.STEP_PROGRESS})  # fmt: skip


def _seconds(x: Any) -> float | None:
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and abs(x) < 1e12
    return float(x) if ok else None


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(max(0.0, b - a), 3)


def recoveries(events: Iterable[Event]) -> list[dict[str, Any] | None]:
    """One entry per ``step_launched``, in order: None for a launch that followed no interruption (a campaign's or
    a fresh attempt's first), else its recovery's timings (module docstring). Events of the wrong shape are
    skipped; a figure the journal cannot give is None."""
    out: list[dict[str, Any] | None] = []
    running = False  # a launch runs: its detections count towards the next verdict
    detected: float | None = None  # the running launch's first detection
    interrupted: tuple[float, str, float | None] | None = None  # (t, class, first detection) of the last verdict
    requeued = False  # an attempt started since that verdict
    current: dict[str, Any] | None = None  # the newest recovery, until its first step
    under_way: float | None = None  # when that recovery's training was under way again
    for e in events:
        kind, t = e.get("type"), _seconds(e.get("t"))
        if t is None:
            continue
        if kind == ev.ATTEMPT_STARTED:
            requeued, running = interrupted is not None, False
        elif kind == ev.DETECTION and running and detected is None:
            detected = t
        elif kind == ev.INTERRUPTION and running:
            interrupted, running = (t, str(e.get("class", ev.UNKNOWN)), detected), False
        elif kind == ev.STEP_LAUNCHED:
            if current is not None and current["how"] == "warm" and under_way is None and interrupted is None:
                interrupted = current["_cause"]  # a warm restart given up before its order was taken: cold now
            current = under_way = None
            if interrupted is not None:
                at, cls, first = interrupted
                warm = e.get("generation") is not None
                current = {"how": "warm" if warm else "requeue" if requeued else "relaunch", "class": cls,
                           "verdict_s": _span(first, at), "teardown_s": None if warm else _span(at, t),
                           "up_s": None, "restore_s": None, "total_s": None,
                           "_from": first if first is not None else at,
                           "_cause": interrupted}  # fmt: skip
                if warm:
                    current.update(release_s=None, order_s=None)
                else:
                    under_way = t
            out.append(current)
            running, detected, interrupted, requeued = True, None, None, False
        elif kind == ev.WARM_RESTART_ORDERED and current is not None and "release_s" in current:
            current.update(release_s=_seconds(e.get("release_s")), order_s=_seconds(e.get("order_s")))
            current["teardown_s"] = _span(current["_cause"][0], t)
            under_way = t
        elif kind == ev.STEP_PROGRESS and current is not None and under_way is not None:
            first_step = _seconds(e.get("step_t", t)) or t
            if "release_s" in current and first_step < under_way:  # stepped before the order was seen taken:
                sent = under_way - (current["order_s"] or 0.0)  # it was taken by then (a standby seen late)
                current.update(order_s=_span(sent, first_step), teardown_s=_span(current["_cause"][0], first_step))
                under_way = first_step
            current.update(up_s=_span(under_way, first_step), total_s=_span(current["_from"], first_step),
                           restore_s=_span(0.0, _seconds(e.get("restore_s"))))
            current = under_way = None
    return [None if r is None else {k: v for k, v in r.items() if not k.startswith("_")} for r in out]

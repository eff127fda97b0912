"""The campaign report: a pure fold over the journal (contract: ``supervise report --json``).

An *attempt* in the report is one launch of the training step: the first launch of each Slurm run, and every
relaunch inside the allocation after a crash or hang. Each has the Slurm job id and restart count it ran under
and the outcome that ended it. Time accounting (goodput) comes from the same events:

- productive: training-step time that was not thrown away;
- lost_work: training time after the last checkpoint the next launch resumed from (estimated from steps);
- restart: from an interruption (or attempt start) until the next launch;
- queue: from a requeue until Slurm started the next run;
- detection: from the last sign of progress to the detection of a hang (the detector's silence duration);
- checkpoint: time ranks reported in the checkpoint phase (from ``checkpoint_committed`` durations);
- other: the remainder of the wall time (teardown, supervisor start-up...).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from supervisor.decisions import events as ev

Event = dict[str, Any]


def _attempt(job: Event | None, launch: Event) -> dict[str, Any]:
    return {
        "job_id": (job or {}).get("job_id"),
        "restart": (job or {}).get("restart", 0),
        "launch": launch.get("launch"),
        "start": launch["t"],
        "end": None,
        "nodes": launch.get("nodes", []),
        "excluded": launch.get("excluded", []),
        "resume_from": launch.get("resume_from"),
        "resume_step": launch.get("resume_step"),
        "last_step": None,
        "outcome": None,
    }


def _outcome(cls: str, blamed: Iterable[str] = (), evidence: Iterable[str] = ()) -> dict[str, Any]:
    return {"class": cls, "blamed_nodes": sorted(set(blamed)), "evidence": list(evidence)}


def fold(events: list[Event], now: float) -> dict[str, Any]:
    """Build the report from journal events (in order). ``now`` closes the books of a running campaign."""
    campaign = None
    state = "pending"
    attempts: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    job: Event | None = None
    start_t: float | None = None
    end_t: float | None = None
    excluded: set[str] = set()
    quarantined: list[dict[str, Any]] = []
    latest_ckpt: dict[str, Any] | None = None
    bad = {"lost_work": 0.0, "restart": 0.0, "checkpoint": 0.0, "queue": 0.0, "detection": 0.0, "other": 0.0}
    gap_from: float | None = None  # start of a restart gap
    queue_from: float | None = None  # start of a queue gap
    reason = ""

    def close(cls: str, t: float, blamed: Iterable[str], evidence: Iterable[str], last_step: Any = None) -> None:
        nonlocal current, gap_from
        if current is None:
            return
        current["end"] = t
        current["outcome"] = _outcome(cls, blamed, evidence)
        if last_step is not None:
            current["last_step"] = last_step
        current = None
        gap_from = t

    for e in events:
        t, kind = float(e.get("t", 0.0)), e.get("type")
        if kind == ev.CAMPAIGN_STARTED:
            campaign = e.get("campaign")
            start_t = t
        elif kind == ev.ATTEMPT_STARTED:
            job = e
            state = "running"
            if queue_from is not None:
                bad["queue"] += max(0.0, t - queue_from)
                queue_from = None
            gap_from = t
        elif kind == ev.STEP_LAUNCHED:
            if gap_from is not None:
                bad["restart"] += max(0.0, t - gap_from)
                gap_from = None
            current = _attempt(job, e)
            attempts.append(current)
            excluded.update(e.get("excluded", []))
        elif kind == "step_ended" and current is not None:
            current["last_step"] = e.get("last_step")
        elif kind == ev.INTERRUPTION:
            close(e.get("class", "unknown"), t, e.get("blamed_nodes", []), e.get("evidence", []), e.get("last_step"))
        elif kind == ev.DETECTION and e.get("kind") in ("rank_hang", "global_stall", "rank_stopped"):
            bad["detection"] += float(e.get("duration_s") or 0.0)
        elif kind == "nodes_excluded":
            excluded.update(e.get("nodes", []))
        elif kind == ev.ATTEMPT_ENDED:
            outcome = e.get("outcome", {})
            close(outcome.get("class", "unknown"), t, outcome.get("blamed_nodes", []), outcome.get("evidence", []))
            gap_from = None
            queue_from = t
            state = "pending"
        elif kind == ev.CHECKPOINT_COMMITTED:
            latest_ckpt = {"step": e.get("step"), "path": e.get("path")}
            bad["checkpoint"] += float(e.get("duration_s") or 0.0)
        elif kind == "checkpoint_quarantined":
            quarantined.append({"path": e.get("path"), "reason": e.get("reason")})
        elif kind == "checkpoint_selected":
            latest_ckpt = {"step": e.get("step"), "path": e.get("path")}
        elif kind == ev.CAMPAIGN_ENDED:
            state = e.get("state", state)
            reason = e.get("reason", "")
            end_t = t
            queue_from = gap_from = None

    _lost_work(attempts, bad)
    until = end_t if end_t is not None else now
    wall = max(0.0, until - start_t) if start_t is not None else 0.0
    if current is not None:  # still running: count it up to now
        current_run = max(0.0, until - current["start"])
    else:
        current_run = 0.0
    ran = sum((a["end"] - a["start"]) for a in attempts if a["end"] is not None) + current_run
    if queue_from is not None:
        bad["queue"] += max(0.0, until - queue_from)
    if gap_from is not None and state == "running":
        bad["restart"] += max(0.0, until - gap_from)
    productive = max(0.0, ran - bad["lost_work"] - bad["detection"] - bad["checkpoint"])
    accounted = productive + sum(v for k, v in bad.items() if k != "other")
    bad["other"] = max(0.0, wall - accounted)
    return {
        "campaign": campaign,
        "state": state,
        "reason": reason,
        "attempts": attempts,
        "excluded_nodes": sorted(excluded),
        "checkpoints": {"latest_valid": latest_ckpt, "quarantined": quarantined},
        "goodput": {
            "wall_s": round(wall, 3),
            "productive_s": round(productive, 3),
            "ettr": round(productive / wall, 4) if wall > 0 else None,
            "badput_s": {k: round(v, 3) for k, v in bad.items()},
        },
    }


def _lost_work(attempts: list[dict[str, Any]], bad: dict[str, float]) -> None:
    """Work redone: steps a launch reached beyond the checkpoint the next launch resumed from."""
    for prev, nxt in zip(attempts, attempts[1:], strict=False):
        last, resumed = prev.get("last_step"), nxt.get("resume_step")
        first = prev.get("resume_step") or 0
        if last is None or prev["end"] is None or last <= first:
            continue
        resumed = resumed if resumed is not None else 0
        per_step = (prev["end"] - prev["start"]) / max(1, last - first)
        bad["lost_work"] += max(0, last - max(resumed, first)) * per_step


def render_text(report: dict[str, Any]) -> str:
    """The human view of a report."""
    lines = [f"campaign {report['campaign']}: {report['state']}" + (f" ({report['reason']})" if report["reason"] else "")]
    lines.append(f"{'#':>3} {'job':>8} {'restart':>7} {'launch':>6} {'dur_s':>8} {'last_step':>9}  outcome")
    for i, a in enumerate(report["attempts"], 1):
        dur = (a["end"] - a["start"]) if a["end"] is not None else None
        out = a["outcome"]
        text = "running" if out is None else out["class"]
        if out and out["blamed_nodes"]:
            text += " blamed=" + ",".join(out["blamed_nodes"])
        if out and out["evidence"]:
            text += f"  [{out['evidence'][0]}]"
        lines.append(
            f"{i:>3} {a['job_id'] or '-':>8} {a['restart']:>7} {a['launch'] or '-':>6} "
            f"{'-' if dur is None else f'{dur:.1f}':>8} {'-' if a['last_step'] is None else a['last_step']:>9}  {text}"
        )
    g = report["goodput"]
    lines.append(f"excluded nodes: {', '.join(report['excluded_nodes']) or 'none'}")
    ck = report["checkpoints"]["latest_valid"]
    lines.append("latest valid checkpoint: " + ("none" if not ck else f"step {ck['step']} at {ck['path']}"))
    ettr = "-" if g["ettr"] is None else f"{g['ettr']:.1%}"
    lines.append(f"goodput: wall {g['wall_s']:.1f} s, productive {g['productive_s']:.1f} s, ETTR {ettr}")
    lines.append("badput: " + ", ".join(f"{k} {v:.1f} s" for k, v in g["badput_s"].items()))
    return "\n".join(lines)

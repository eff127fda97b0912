"""The campaign report (contract: ``supervise report --json``): a view of the one journal fold.

The attempts, outcomes and goodput accounting are computed by ``supervisor.decisions.campaign_state`` (see
``Accounting`` there for what each badput bucket counts); this module renders them.
"""

from __future__ import annotations

from typing import Any

from supervisor.decisions import campaign_state

Event = dict[str, Any]


def fold(events: list[Event], now: float) -> dict[str, Any]:
    """Build the report from journal events (in order). ``now`` closes the books of a running campaign."""
    return campaign_state.fold(events).report(now)


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
    for i, a in enumerate(report["attempts"], 1):
        stacks = a.get("stacks") or {}
        if stacks:
            lines.append(f"launch {i}: {len(stacks['saved'])} stack dump(s) saved before the kill")
        for miss in stacks.get("without_stack", []):
            lines.append(f"launch {i}: no stack for rank {miss['rank']} on {miss['node']}: {miss['why']}")
        if a.get("recovery"):
            lines.append(f"launch {i}: " + recovery_text(a["recovery"]))
        restarts = a.get("torchrun_restarts") or {}
        if restarts:
            by_node = ", ".join(f"{node} x{n}" for node, n in sorted(restarts.items()))
            lines.append(f"launch {i}: torchrun restarted its workers {sum(restarts.values())} time(s) ({by_node})")
    g = report["goodput"]
    if report.get("unreadable_events"):
        lines.append(f"{report['unreadable_events']} journal event(s) had fields of the wrong type and were skipped")
    lines.append(f"excluded nodes: {', '.join(report['excluded_nodes']) or 'none'}")
    ck = report["checkpoints"]["latest_valid"]
    lines.append("latest valid checkpoint: " + ("none" if not ck else f"step {ck['step']} at {ck['path']}"))
    for change in report.get("environment_changes") or []:
        lines.append(f"resumed from {change.get('checkpoint')} in another environment: "
                     + "; ".join(change.get("differences") or []))  # fmt: skip
    if report.get("checkpoint_interval"):
        lines.append("checkpoint interval: " + interval_text(report["checkpoint_interval"]))
    ettr = "-" if g["ettr"] is None else f"{g['ettr']:.1%}"
    lines.append(f"goodput: wall {g['wall_s']:.1f} s, productive {g['productive_s']:.1f} s, ETTR {ettr}")
    lines.append("badput: " + ", ".join(f"{k} {v:.1f} s" for k, v in g["badput_s"].items() if v))
    if g.get("ideal_step_s"):
        lines.append(f"ideal step time: {g['ideal_step_s']:.3f} s (mean of the steps <= median + 3 MAD)")
    if g.get("by_class"):
        lines.append("badput by interruption class:")
    for cls, entry in (g.get("by_class") or {}).items():
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in entry["badput_s"].items() if v)
        lines.append(f"  {cls} x{entry['interruptions']}: {entry['total_s']:.1f} s ({parts or 'nothing'})")
    if g.get("by_restart"):
        lines.append("badput by how the training came back (warm restart, relaunch, requeue):")
    for how, entry in (g.get("by_restart") or {}).items():
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in entry["badput_s"].items() if v)
        lines.append(f"  {how} x{entry['interruptions']}: {entry['total_s']:.1f} s ({parts or 'nothing'})")
    return "\n".join(lines)


def recovery_text(r: dict[str, Any]) -> str:
    """One line for a launch's recovery timings (decisions/recovery_timings.py); "-" where the journal has none."""

    def sec(key: str) -> str:
        return "-" if r.get(key) is None else f"{r[key]:.1f} s"

    how = {"warm": "warm restart", "relaunch": "relaunch", "requeue": "requeue"}.get(str(r.get("how")), "restart")
    parts = [f"verdict {sec('verdict_s')}", f"teardown {sec('teardown_s')}"]
    if r.get("how") == "warm":
        parts[-1] += f" (release {sec('release_s')}, order {sec('order_s')})"
    up = f"to the first step {sec('up_s')}"
    if r.get("restore_s") is not None:
        up += f" (state load {r['restore_s']:.2f} s)"  # (often a small part: hundredths say it)
    parts += [up, f"in all {sec('total_s')}"]
    return f"back by {how} after {r.get('class')}: " + ", ".join(parts)


def interval_text(a: dict[str, Any]) -> str:
    """One line for the checkpoint interval in force (``checkpoint_interval`` event), for report and status."""
    if a.get("interval_s") is None:
        why = "off" if a.get("mode") == "off" else "auto, waiting for a measured checkpoint stall"
        return f"not asked ({why})"

    def pct(x: Any) -> str:
        return "-" if x is None else f"{x:.1%}"

    delta = "-" if a.get("delta_s") is None else f"{a['delta_s']:.2f} s"
    restart = "-" if a.get("restart_s") is None else f"{a['restart_s']:.0f} s"
    mtbf = "-" if a.get("mtbf_s") is None else f"{a['mtbf_s'] / 3600:.1f} h"
    if a.get("mode") == "auto" and a.get("delta_s") is None:
        return (f"{a['interval_s']:.0f} s after the first step (auto: a first checkpoint, to measure the stall; "
                f"restart {restart}, MTBF {mtbf} {a.get('mtbf_source')})")
    return (f"{a['interval_s']:.0f} s ({a.get('mode')}; stall {delta}, restart {restart}, MTBF {mtbf} "
            f"{a.get('mtbf_source')}; predicted goodput {pct(a.get('predicted_goodput'))}, "
            f"best {pct(a.get('optimum_goodput'))})")

"""The fleet as operators see it (issue 24): every campaign's latest figures, every node's verdicts, lemon score and
repair state, and the interruptions by class over time. Pure: the service reads its store and hands the rows here;
the fleet page (``site/page.py``), ``GET /v1/fleet`` and the Prometheus metrics (``site/fleet_metrics.py``) are all
views of the one :func:`fleet_view`, so the page and the dashboard cannot disagree.

A node's repair state comes from the repair loop's own record (its last step that Slurm took): ``drained``,
``rebooting`` (``scontrol reboot`` accepted, the node not yet back), ``returned`` (resumed, or forgiven after the
loop drained it); a node the loop never touched is ``in service`` as far as the site knows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

ATTEMPTS_KEPT = 100  # the newest launches a campaign sends (its page strip; the full picture is its own report)
INTERRUPTIONS_WINDOW_S = 30 * 86400.0
REPAIR_STATES = {"drain": "drained", "reboot": "rebooting", "resume": "returned", "forgive": "returned"}


@dataclass(frozen=True)
class Attempt:
    """One launch of a campaign: when, how it ended (None: still running) and the nodes its end blamed."""

    start: float
    end: float | None
    klass: str | None
    blamed: Sequence[str] = ()


@dataclass(frozen=True)
class CampaignStatus:
    """A campaign's latest figures, as its supervisor last sent them (``t``: when the service took them)."""

    user: str
    campaign: str  # the campaign's directory (``supervise report DIR`` draws its full timeline)
    job: str
    state: str
    reason: str
    wall_s: float
    productive_s: float
    ettr: float | None
    attempts: tuple[Attempt, ...] = ()
    t: float = 0.0


@dataclass(frozen=True)
class Interrupted:
    """One interruption a campaign told the site of (every class, preemptions included)."""

    t: float
    user: str
    campaign: str
    job: str
    klass: str
    nodes: tuple[str, ...] = field(default_factory=tuple)


def status_from_report(report: Mapping[str, Any], *, user: str, campaign: str, job: str, t: float) -> CampaignStatus:
    """What a campaign sends of its report (``campaign_state`` fold): state, goodput and its newest launches."""
    g = report.get("goodput") or {}
    attempts = []
    for a in list(report.get("attempts") or [])[-ATTEMPTS_KEPT:]:
        out = a.get("outcome") or {}
        attempts.append(Attempt(float(a.get("start") or 0.0), a.get("end"), out.get("class"),
                                tuple(out.get("blamed_nodes") or ())))  # fmt: skip
    return CampaignStatus(user=user, campaign=campaign, job=job, state=str(report.get("state") or "unknown"),
                          reason=str(report.get("reason") or ""), wall_s=float(g.get("wall_s") or 0.0),
                          productive_s=float(g.get("productive_s") or 0.0), ettr=g.get("ettr"),
                          attempts=tuple(attempts), t=t)  # fmt: skip


def repair_states(repairs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each node's repair state after the loop's steps (oldest first): its last step Slurm took, and when."""
    out: dict[str, dict[str, Any]] = {}
    for r in repairs:
        state = REPAIR_STATES.get(str(r.get("kind")))
        if state is not None and r.get("error") is None:
            out[str(r["node"])] = {"state": state, "t": r["t"], "reason": r.get("reason") or ""}
    return out


def buckets(interruptions: Iterable[Interrupted], now: float, window_s: float = INTERRUPTIONS_WINDOW_S
            ) -> dict[str, Any]:  # fmt: skip
    """Interruptions by class in equal time buckets over the window: hours for a window of up to two days, days
    beyond (so the chart keeps 24-60 bars)."""
    size = 3600.0 if window_s <= 2 * 86400 else 86400.0
    first = (now - window_s) // size * size
    count = int((now - first) // size) + 1
    rows: list[dict[str, int]] = [{} for _ in range(count)]
    classes: set[str] = set()
    for i in interruptions:
        k = int((i.t - first) // size)
        if 0 <= k < count:
            rows[k][i.klass] = rows[k].get(i.klass, 0) + 1
            classes.add(i.klass)
    return {"bucket_s": size, "classes": sorted(classes),
            "buckets": [{"t": first + k * size, "counts": row} for k, row in enumerate(rows)]}  # fmt: skip


def fleet_view(*, now: float, campaigns: Sequence[CampaignStatus], scores: Sequence[Any],
               interruptions: Sequence[Interrupted], repairs: Sequence[Mapping[str, Any]],
               forgiven: Mapping[str, float], verdicts: Sequence[Any], colours: Mapping[str, str],
               window_s: float = INTERRUPTIONS_WINDOW_S) -> dict[str, Any]:  # fmt: skip
    """The fleet page's document (``GET /v1/fleet``). ``scores``: ``decisions.lemon.LemonScore`` per node;
    ``verdicts``: ``SiteVerdict`` rows of the window (newest shown per node); ``colours``: outcome -> colour (the
    campaign timeline's, ``plot/timeline.py``: a class has the same colour on every picture)."""
    last: dict[tuple[str, str], Interrupted] = {}
    for i in interruptions:
        last[(i.user, i.campaign)] = i
    rows = []
    for c in campaigns:
        doc = asdict(c)
        doc["attempts"] = [asdict(a) for a in c.attempts]
        hit = last.get((c.user, c.campaign))
        doc["last_interruption"] = None if hit is None else {"t": hit.t, "class": hit.klass, "nodes": list(hit.nodes)}
        rows.append(doc)
    repair = repair_states(repairs)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for v in verdicts:
        by_node.setdefault(v.node, []).insert(0, {"t": v.t, "class": v.klass, "source": v.source, "user": v.user})
    nodes = []
    for s in scores:
        doc = asdict(s)
        doc["repair"] = repair.get(s.node, {"state": "in service", "t": None, "reason": ""})
        doc["forgiven_at"] = forgiven.get(s.node)
        doc["verdicts"] = by_node.get(s.node, [])[:5]
        nodes.append(doc)
    for node in sorted(set(repair) - {s.node for s in scores}):  # repaired, no failure left in the window
        nodes.append({"node": node, "failures": 0, "users": 0, "jobs": 0, "exposure_h": None, "expected": None,
                      "p_value": None, "lemon": False, "why": "", "repair": repair[node],
                      "forgiven_at": forgiven.get(node), "verdicts": []})  # fmt: skip
    nodes.sort(key=lambda n: (not n["lemon"], -n["failures"], n["node"]))
    return {"now": now, "campaigns": rows, "nodes": nodes, "interruptions": buckets(interruptions, now, window_s),
            "repairs": [dict(r) for r in list(repairs)[-50:]][::-1], "colours": dict(colours)}  # fmt: skip

"""The one fold of the journal into campaign state. Pure.

Everything that reads the campaign's past reads it through :func:`fold`: the loop (learned timeouts to restore,
quarantined checkpoints, the best committed step, the previous Slurm run's missing outcome), the policy's
:class:`~supervisor.decisions.policy.History`, the node :class:`~supervisor.decisions.ledger.Ledger`, and the report
and status (attempts and goodput). One pass over the events feeds each view its per-event step, so no two
readers can disagree about what the journal says.

Vocabulary (docs/architecture.md, "Glossary"): an *attempt* is one Slurm run of the job (``attempt_started``);
a *launch* is one srun of the training inside it (journaled as ``step_launched``, the contract's name).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from supervisor.decisions import events as ev
from supervisor.decisions import goodput, recovery_timings
from supervisor.decisions.checkpoint_interval import IntervalInputs
from supervisor.decisions.ledger import Ledger, LedgerConfig
from supervisor.decisions.policy import History

Event = Mapping[str, Any]
HANG_DETECTIONS = ("rank_hang", "global_stall", "rank_stopped")


def _outcome(cls: Any, blamed: Any = (), evidence: Any = ()) -> dict[str, Any]:
    return {"class": _text(cls, ev.UNKNOWN), "blamed_nodes": sorted(set(_texts(blamed))), "evidence": _texts(evidence)}


# What the report keeps of an event's fields, in the types it promises: a field of another type (a bug, a hand
# edit) reads as absent, so one odd line never breaks the report or the text that renders it.
def _text(x: Any, default: Any = None) -> Any:
    return x if isinstance(x, str) else default


def _texts(x: Any) -> list[str]:
    return [v for v in x if isinstance(v, str)] if isinstance(x, (list, tuple)) else []


def _count(x: Any, default: Any = None) -> Any:
    return x if isinstance(x, int) and not isinstance(x, bool) and abs(x) < 1 << 62 else default


def _mapping(x: Any) -> Mapping[str, Any]:
    return x if isinstance(x, Mapping) else {}


def _a_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < 1e300 and math.isfinite(x)


_INTERVAL_FIGURES = frozenset({"t", "interval_s", "delta_s", "restart_s", "mtbf_s", "predicted_goodput",
                               "optimum_goodput"})  # fmt: skip


class Accounting:
    """Launches, their outcomes and the time accounting of the report (``supervise report``/``status``).

    A row of ``launches`` is one launch of the training: the first of each Slurm run, and every relaunch inside
    the allocation after a crash or hang; it carries the Slurm job id and restart count it ran under. (The report's
    contract calls these rows ``attempts``.) The time accounting is the exact ledger of
    :mod:`supervisor.decisions.goodput` (every millisecond in one bucket, per launch and per interruption class).
    """

    def __init__(self) -> None:
        self.campaign: Any = None
        self.state = "pending"
        self.reason = ""
        self.launches: list[dict[str, Any]] = []
        self.current: dict[str, Any] | None = None
        self.attempt: Event | None = None  # the open attempt's attempt_started (its job id and restart count)
        self.excluded: set[str] = set()
        self.quarantined: list[dict[str, Any]] = []
        self.env_changes: list[dict[str, Any]] = []  # launches resumed in another environment than their checkpoint's
        self.latest_ckpt: dict[str, Any] | None = None
        self.timed: list[Event] = []  # the events the goodput ledger folds
        self.recovery_events: list[Event] = []  # ... and those the recoveries' timings fold
        self.interval: dict[str, Any] | None = None  # the last checkpoint interval asked of the ranks

    def _close(self, cls: Any, t: float, blamed: Any, evidence: Any, last_step: int | None = None) -> None:
        if self.current is None:
            return
        self.current["end"] = t
        self.current["outcome"] = _outcome(cls, blamed, evidence)
        if last_step is not None:
            self.current["last_step"] = last_step
        self.current = None

    def apply(self, e: Event) -> None:
        t, kind = float(e.get("t", 0.0)), e.get("type")
        if kind in LEDGER_EVENTS or (kind == ev.DETECTION and e.get("kind") in HANG_DETECTIONS):
            self.timed.append(e)
        if kind in recovery_timings.RECOVERY_EVENTS:
            self.recovery_events.append(e)
        if kind == ev.CAMPAIGN_STARTED:
            self.campaign = _text(e.get("campaign"))
        elif kind == ev.ATTEMPT_STARTED:
            self.attempt = e
            self.state = "running"
        elif kind == ev.STEP_LAUNCHED:
            attempt = self.attempt or {}
            self.current = {
                "job_id": _text(attempt.get("job_id")),
                "restart": _count(attempt.get("restart"), 0),
                "launch": _count(e.get("launch")),
                "start": t,
                "end": None,
                "nodes": _texts(e.get("nodes")),
                "excluded": _texts(e.get("excluded")),
                "resume_from": _text(e.get("resume_from")),
                "resume_step": _count(e.get("resume_step")),
                "last_step": None,
                "outcome": None,
            }
            if e.get("generation") is not None:  # a warm restart: the same job step, its ranks in a new generation
                given = e.get("replaced_ranks")
                replaced: list[Any] = given if isinstance(given, list) else []
                self.current.update(warm=True, generation=_count(e.get("generation")),
                                    replaced_ranks=[r for r in map(_count, replaced) if r is not None])  # fmt: skip
            self.launches.append(self.current)
            self.excluded.update(self.current["excluded"])
        elif kind == ev.INTERRUPTION:
            restarts = {k: n for k, n in _mapping(e.get("torchrun_restarts")).items() if _count(n) is not None}
            if restarts and self.current is not None:  # torchrun's own, inside the launch
                self.current["torchrun_restarts"] = restarts
            self._close(e.get("class"), t, e.get("blamed_nodes"), e.get("evidence"), _count(e.get("last_step")))
        elif kind == ev.STACKS and self.launches:
            # The dumps taken before the launch was killed (they follow its interruption in the journal).
            stacks = self.launches[-1].setdefault("stacks", {"saved": [], "without_stack": []})
            key = {"node": _text(e.get("node")), "rank": _count(e.get("rank"))}
            stacks["without_stack"] = [r for r in stacks["without_stack"]
                                       if {"node": r["node"], "rank": r["rank"]} != key]  # fmt: skip
            if e.get("result") == "stacks_saved":
                stacks["saved"].append({**key, "path": _text(e.get("detail"))})
            else:
                stacks["without_stack"].append({**key, "why": _text(e.get("detail"))})
        elif kind == ev.NODES_EXCLUDED:
            self.excluded.update(_texts(e.get("nodes")))
        elif kind == ev.ATTEMPT_ENDED:
            outcome = _mapping(e.get("outcome"))
            self._close(outcome.get("class"), t, outcome.get("blamed_nodes"), outcome.get("evidence"))
            self.state = "pending"
        elif kind == ev.CHECKPOINT_COMMITTED:
            self.latest_ckpt = {"step": _count(e.get("step")), "path": _text(e.get("path"))}
        elif kind == ev.CHECKPOINT_INTERVAL:  # numbers stay numbers (or absent), words stay words
            self.interval = {k: (v if _a_number(v) else None) if k in _INTERVAL_FIGURES else _text(v)
                             for k, v in e.items() if k not in ("type", "v")}  # fmt: skip
        elif kind == ev.ENV_CHANGED:
            self.env_changes.append({"t": t, "checkpoint": _text(e.get("checkpoint")),
                                     "differences": _texts(e.get("differences"))})  # fmt: skip
        elif kind == ev.CHECKPOINT_QUARANTINED:
            self.quarantined.append({"path": _text(e.get("path")), "reason": _text(e.get("reason"))})
        elif kind == ev.CAMPAIGN_ENDED:
            self.state = _text(e.get("state"), self.state)
            self.reason = _text(e.get("reason"), "")

    def report(self, now: float) -> dict[str, Any]:
        """The report document (contract: ``report --json``). ``now`` closes the books of a running campaign."""
        launches = [dict(a) for a in self.launches]
        book = goodput.ledger(self.timed, now)
        for row, a in zip(book["rows"], launches, strict=False):
            a["goodput"] = _row_goodput(row)
        for recovery, a in zip(recovery_timings.recoveries(self.recovery_events), launches, strict=False):
            if recovery is not None:  # how this launch came back from the last one's interruption, phase by phase
                a["recovery"] = recovery
        total = book["buckets_ms"]
        wall = book["wall_ms"]
        return {
            "campaign": self.campaign,
            "state": self.state,
            "reason": self.reason,
            "attempts": launches,
            "torchrun_restarts": sum(n for a in launches for n in (a.get("torchrun_restarts") or {}).values()),
            "excluded_nodes": sorted(self.excluded),
            "checkpoints": {"latest_valid": self.latest_ckpt, "quarantined": list(self.quarantined)},
            "checkpoint_interval": self.interval,
            "environment_changes": [dict(c) for c in self.env_changes],
            "goodput": {
                "wall_s": wall / 1000,
                "productive_s": total["productive"] / 1000,
                "ettr": round(total["productive"] / wall, 4) if wall > 0 else None,
                "badput_s": goodput.to_seconds({k: total[k] for k in goodput.BADPUT}),
                "ideal_step_s": book["ideal_step_s"],
                "before_first_launch_s": goodput.to_seconds(_every_bucket(book["pre_launch_ms"])),
                "by_class": {  # every badput bucket, zeros included (the contract: nothing to guess)
                    cls: {"interruptions": entry["count"],
                          "badput_s": goodput.to_seconds(_every_bucket(entry["buckets_ms"])),
                          "total_s": sum(entry["buckets_ms"].values()) / 1000}
                    for cls, entry in sorted(book["by_class"].items())
                },  # fmt: skip
                "by_restart": {  # the same costs by how the training came back (warm, relaunch, requeue)
                    how: {"interruptions": entry["count"],
                          "badput_s": goodput.to_seconds(_every_bucket(entry["buckets_ms"])),
                          "total_s": sum(entry["buckets_ms"].values()) / 1000}
                    for how, entry in sorted(book["by_restart"].items())
                },  # fmt: skip
            },
        }


LEDGER_EVENTS = frozenset({ev.CAMPAIGN_STARTED, ev.ATTEMPT_STARTED, ev.STEP_LAUNCHED, ev.INTERRUPTION,
                           ev.ATTEMPT_ENDED, ev.CAMPAIGN_ENDED, ev.STEP_PROGRESS, ev.CHECKPOINT_STALL,
                           ev.CHECKPOINT_COMMITTED, goodput.PREFLIGHT})  # fmt: skip


def _every_bucket(ms: Mapping[str, int]) -> dict[str, int]:
    return {k: ms.get(k, 0) for k in goodput.BADPUT}


def _row_goodput(row: Mapping[str, Any]) -> dict[str, Any]:
    b = row["buckets_ms"]
    start, end = row["span_ms"]
    return {"wall_s": (end - start) / 1000, "productive_s": b["productive"] / 1000,
            "badput_s": goodput.to_seconds({k: b[k] for k in goodput.BADPUT}), "kept_steps": row["kept_steps"]}


class View(Protocol):
    """A reader's own view of the journal, fed by the one fold (``fold(events, views=...)``) in the same pass,
    e.g. the plot's timeline: a reader never walks the journal itself."""

    def apply(self, e: Event) -> None: ...


@dataclass
class CampaignState:
    """What the journal says about the campaign, as of its last event. The supervision loop keeps one and applies
    each event it journals (``driver.recorder``); every other reader folds the journal once (:func:`fold`)."""

    history: History = field(default_factory=History)
    ledger: Ledger = field(default_factory=Ledger)
    accounting: Accounting = field(default_factory=Accounting)
    interval: IntervalInputs = field(default_factory=IntervalInputs)  # the checkpoint interval's measured inputs
    started: bool = False  # campaign_started was journaled (by the first Slurm run)
    timeouts: Mapping[str, Any] | None = None  # the last learned step-time histograms (timeouts_learned)
    quarantined: set[str] = field(default_factory=set)  # paths of quarantined checkpoints
    best_step: int | None = None  # newest committed checkpoint's iteration
    open_attempt: Event | None = None  # a Slurm run that started and has no recorded end
    last_seen: float = 0.0  # time of the last event
    silent_nodes: set[str] = field(default_factory=set)  # node_silent detections during the open attempt
    failsafe: Event | None = None  # an agent's failsafe ended the open attempt (its batch host was lost)
    last_attempt: Event | None = None  # the newest attempt_started, ended or not
    ended: Event | None = None  # campaign_ended after the newest attempt_started
    job_id: str | None = None  # the newest Slurm job the journal names (attempt_started, else campaign_started)
    attempts: int = 0  # Slurm runs started
    interruptions: dict[str, int] = field(default_factory=dict)  # every interruption by class, completed included
    excluded_now: set[str] = field(default_factory=set)  # the ExcNodeList last written, forgiven nodes taken out
    memory_off: str = ""  # why the memory tier is off for the campaign (a memory_off event): "" while it is on
    last_commit_t: float | None = None  # when the newest checkpoint was journaled as committed
    checkpoint_request_t: float | None = None  # when the newest checkpoint_requested was journaled
    saved_since_request: int | None = None  # the step of the newest checkpoint committed since that request
    views: tuple[View, ...] = ()  # the caller's own views, fed in the same pass
    unreadable: int = 0  # events a view could not take (a type-confused field: a bug or a hand edit), skipped

    def apply(self, e: Event) -> None:
        """Take one event into every view. The fold never raises: an event whose time is not a number is skipped
        whole, and one a view cannot take (a field of the wrong type) is skipped by that view and counted, so one
        odd line costs its own information, never a restart (the loop folds the journal at every start)."""
        if not _a_number(e.get("t")):  # (an int of 400 digits is not one: float() of it would raise)
            self.unreadable += 1
            return
        ok = self._take(lambda: setattr(self, "history", self.history.apply(e)))
        views: tuple[View, ...] = (self.ledger, self.accounting, self.interval, *self.views)
        for view in views:
            ok = self._take(view.apply, e) and ok
        ok = self._take(self._facts, e) and ok
        if not ok:
            self.unreadable += 1

    @staticmethod
    def _take(step: Callable[..., Any], *args: Any) -> bool:
        try:
            step(*args)
        except (TypeError, ValueError, KeyError, AttributeError, OverflowError, IndexError, RecursionError):
            return False
        return True

    def _facts(self, e: Event) -> None:
        kind = e.get("type")
        self.last_seen = float(e.get("t", self.last_seen))
        if kind == ev.CAMPAIGN_STARTED:
            self.started = True
            self.job_id = str(e["job_id"]) if e.get("job_id") else self.job_id
        elif kind == ev.TIMEOUTS_LEARNED and isinstance(e.get("histograms"), Mapping):  # the last one wins
            self.timeouts = e["histograms"]  # a requeued run keeps what was learned
        elif kind in (ev.CHECKPOINT_QUARANTINED, ev.CHECKPOINT_REFUSED):  # each said once per campaign
            self.quarantined.add(str(e.get("path")))
        elif kind == ev.CHECKPOINT_COMMITTED and isinstance(e.get("step"), int):
            self.best_step = max(self.best_step or 0, e["step"])
            self.last_commit_t = float(e.get("t", self.last_seen))
            if self.checkpoint_request_t is not None:
                self.saved_since_request = e["step"]
        elif kind == ev.CHECKPOINT_REQUESTED:
            self.checkpoint_request_t, self.saved_since_request = float(e.get("t", self.last_seen)), None
        elif kind == ev.ATTEMPT_STARTED:
            self.open_attempt = self.last_attempt = e
            self.silent_nodes = set()
            self.failsafe = self.ended = None
            self.attempts += 1
            self.job_id = str(e["job_id"]) if e.get("job_id") else self.job_id
        elif kind in (ev.ATTEMPT_ENDED, ev.CAMPAIGN_ENDED):
            self.open_attempt = None
            self.ended = e if kind == ev.CAMPAIGN_ENDED else self.ended
        elif kind == ev.FAILSAFE and self.open_attempt is not None:
            self.failsafe = e
        elif kind == ev.DETECTION and e.get("kind") in ("node_silent", "node_lost") and self.open_attempt is not None:
            self.silent_nodes.update(_texts(e.get("nodes")))
        elif kind == ev.INTERRUPTION:
            cls = str(e.get("class", ev.UNKNOWN))
            self.interruptions[cls] = self.interruptions.get(cls, 0) + 1
        elif kind == ev.NODES_EXCLUDED:
            self.excluded_now = {str(n) for n in e.get("nodes") or ()}
        elif kind == ev.NODE_FORGIVEN:
            self.excluded_now.discard(str(e.get("node")))
        elif kind == ev.MEMORY_OFF:  # a node's store failed the tier: off for the rest of the campaign
            self.memory_off = self.memory_off or str(e.get("why") or "a node's memory store failed")

    def report(self, now: float) -> dict[str, Any]:
        doc = self.accounting.report(now)
        if self.unreadable:  # said, so a reader knows the figures leave something out
            doc["unreadable_events"] = self.unreadable
        return doc


def fold(events: Iterable[Event], ledger_config: LedgerConfig | None = None, views: Iterable[View] = ()
         ) -> CampaignState:  # fmt: skip
    """The campaign state after ``events`` (in journal order); ``views`` are fed every event in the same pass."""
    state = CampaignState(ledger=Ledger(ledger_config), views=tuple(views))
    for e in events:
        state.apply(e)
    return state


FINAL_STATES = ("completed", "failed", "stopped")

"""What to do about an interruption: tiered response, recovery path, budgets, backoff. Pure.

``decide(interruption, history, allocation, config)`` returns the actions in the order the supervisor loop
executes them. The budgets exist because the seed incident's opposite is just as costly: a supervisor that
restarts a deterministic bug forever burns the allocation. A class's budget counts its interruptions since the
last *progress* (a checkpoint committed at a newer step), so a rare transient fault never exhausts it while a
crash that recurs before the next checkpoint does.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from supervisor.decisions import events as ev
from supervisor.decisions.classify import Interruption
from supervisor.decisions.detect.findings import LOSS_SPIKE, STRAGGLER, WARNING_KINDS, DetectionEvent

# Action kinds (the journal's "action" events carry these).
ALERT = "alert"  # tier L1: log; L2+: also the alert hook (webhook/command)
CHECKPOINT_NOW = "checkpoint_now"  # ask ranks to checkpoint at the next step boundary
# The ranks are gone before they could save (Slurm's SIGTERM reached them first): copy the newest memory snapshot
# to the filesystem for the requeued job (CHECKPOINT_NOW does the same beside the ranks' own save).
FLUSH_MEMORY = "flush_memory"
STOP_STEP = "stop_step"  # L3: ask ranks to checkpoint (params.checkpoint) and exit; kill after params.grace_s
DUMP_STACKS = "dump_stacks"  # L4: save every rank's stacks before killing
KILL_STEP = "kill_step"  # L4: kill the training step now
KILL_RANKS = "kill_ranks"  # instead, before a warm restart: kill only these ranks (target), the hung ones
# Strike the target nodes in the ledger, by the ledger's weight for params["strike"] (a warning kind): carried
# out by journaling the action, which Ledger.fold reads. Interruptions never need it: their event's
# blamed_nodes strike already.
MARK_SUSPECT = "mark_suspect"
DRAIN = "drain"  # operator mode only: scontrol update nodename=... state=drain
BACKOFF = "backoff"  # wait params.seconds before the recovery action
RESTART_IN_ALLOCATION = "restart_in_allocation"  # relaunch the step in this allocation (params.exclude)
WARM_RESTART = "warm_restart"  # instead of the above: the launch restarts in its processes (decisions/warm_restart)
REQUEUE = "requeue"  # scontrol requeue this job, excluding params.exclude
AWAIT_REQUEUE = "await_requeue"  # Slurm itself requeues the job (preemption, node failure): let it
HOLD = "hold"  # requeue held: an operator must release it
STOP = "stop"  # end the campaign (params.state: stopped|failed), with a message saying why and what to do
FINISH = "finish"  # the run completed

# (A straggler swap, ev.STRAGGLER, is the supervisor's own choice: not a fault, no crash-loop count, no backoff.)
FAULT_CLASSES = frozenset(ev.INTERRUPTION_CLASSES) - {ev.PREEMPTION, ev.TIMEOUT, ev.CANCELLED}
# A node blamed for these is never reused for the next launch (an app error blames a node only once it
# repeated there and nowhere else).
HARD_BLAME = frozenset({ev.NODE_FAILURE, ev.HARDWARE, ev.APP_ERROR})
_UNLIMITED = None
# Journal events whose step is a restore point the campaign keeps (History.progress): a committed checkpoint, the
# memory snapshot a launch resumed from (memory_pick) and one flushed to the filesystem (memory_flush).
RESTORE_POINTS = frozenset({ev.CHECKPOINT_COMMITTED, ev.MEMORY_PICK, ev.MEMORY_FLUSH})

DEFAULT_BUDGETS: Mapping[str, int | None] = MappingProxyType(
    {
        ev.PREEMPTION: _UNLIMITED,
        ev.TIMEOUT: 3,  # time limits in a row without a new checkpoint: checkpoints fail or never happen
        ev.CANCELLED: 0,
        ev.NODE_FAILURE: 5,
        ev.HARDWARE: 3,
        ev.HANG: 3,
        ev.COMM_ERROR: 3,
        ev.APP_ERROR: 2,
        ev.NUMERICAL: 2,  # roll backs to a snapshot before the divergence, skipping its batches (since progress)
        ev.UNKNOWN: 3,
        ev.STRAGGLER: 2,  # swaps of a straggler for a spare since progress; then it stays a warning
    }
)
DEFAULT_TIERS: Mapping[str, str] = MappingProxyType(
    {
        ev.PREEMPTION: "L1",
        ev.TIMEOUT: "L1",
        ev.CANCELLED: "L1",
        ev.NODE_FAILURE: "L2",
        ev.HARDWARE: "L4",
        ev.HANG: "L4",
        ev.COMM_ERROR: "L2",
        ev.APP_ERROR: "L2",
        ev.NUMERICAL: "L3",
        ev.UNKNOWN: "L2",
        ev.STRAGGLER: "L3",
    }
)


@dataclass(frozen=True)
class PolicyConfig:
    """Documented defaults (docs/decisions.md, "Policy"); every value is validated on construction."""

    budgets: Mapping[str, int | None] = field(default_factory=lambda: DEFAULT_BUDGETS)  # restarts allowed per class since progress; None: no limit
    tiers: Mapping[str, str] = field(default_factory=lambda: DEFAULT_TIERS)
    max_fault_restarts: int = 20  # all fault classes together within restart_window_s: a crash loop stops
    restart_window_s: float = 3600.0
    backoff_base_s: float = 5.0  # the first restart is immediate; then base, base*factor, ... up to max
    backoff_factor: float = 2.0
    backoff_max_s: float = 300.0
    max_restarts_in_allocation: int = 3  # relaunches in one allocation without progress before a requeue
    stop_grace_s: float = 120.0  # L3: how long ranks get to checkpoint and exit before the step is killed
    checkpoint_on_numerical: bool = False  # never save NaN weights over good ones by default
    on_budget_exhausted: str = "stop"  # "stop" the campaign, or "hold" it queued for an operator
    operator_mode: bool = False  # may drain nodes (needs Slurm operator rights)
    strike_on_warnings: tuple[str, ...] = (STRAGGLER,)  # warnings that strike their node (ledger.weights.<kind>)

    def __post_init__(self) -> None:
        budgets = dict(DEFAULT_BUDGETS)
        for cls, value in self.budgets.items():
            if cls not in ev.RESTART_CLASSES:
                raise ValueError(f"policy.budgets: unknown class {cls!r}; use one of {', '.join(ev.RESTART_CLASSES)}")
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"policy.budgets.{cls} must be a whole number >= 0 or null (no limit), got {value!r}")
            budgets[cls] = value
        tiers = dict(DEFAULT_TIERS)
        for cls, tier in self.tiers.items():
            if cls not in ev.RESTART_CLASSES:
                raise ValueError(f"policy.tiers: unknown class {cls!r}; use one of {', '.join(ev.RESTART_CLASSES)}")
            if tier not in ev.TIERS:
                raise ValueError(f"policy.tiers.{cls} must be one of {', '.join(ev.TIERS)}, got {tier!r}")
            tiers[cls] = tier
        object.__setattr__(self, "budgets", MappingProxyType(budgets))
        object.__setattr__(self, "tiers", MappingProxyType(tiers))
        _positive(self, "restart_window_s", "backoff_max_s", "stop_grace_s")
        _non_negative(self, "backoff_base_s")
        if isinstance(self.max_fault_restarts, bool) or not isinstance(self.max_fault_restarts, int) or \
                self.max_fault_restarts < 1:  # fmt: skip
            raise ValueError(f"policy.max_fault_restarts must be a whole number >= 1, got {self.max_fault_restarts!r}")
        if isinstance(self.max_restarts_in_allocation, bool) or not isinstance(self.max_restarts_in_allocation, int) \
                or self.max_restarts_in_allocation < 0:  # fmt: skip
            raise ValueError(
                f"policy.max_restarts_in_allocation must be a whole number >= 0, got {self.max_restarts_in_allocation!r}"
            )
        if not (isinstance(self.backoff_factor, (int, float)) and self.backoff_factor >= 1):
            raise ValueError(f"policy.backoff_factor must be >= 1, got {self.backoff_factor!r} (try 2)")
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError(
                f"policy.backoff_max_s ({self.backoff_max_s}) must be >= policy.backoff_base_s ({self.backoff_base_s})"
            )
        if self.on_budget_exhausted not in ("stop", "hold"):
            raise ValueError(f"policy.on_budget_exhausted must be 'stop' or 'hold', got {self.on_budget_exhausted!r}")
        for name in ("checkpoint_on_numerical", "operator_mode"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"policy.{name} must be true or false, got {getattr(self, name)!r}")
        strikes = self.strike_on_warnings
        if isinstance(strikes, str) or not all(isinstance(k, str) and k in WARNING_KINDS for k in strikes):
            raise ValueError(f"policy.strike_on_warnings must be a list of {', '.join(sorted(WARNING_KINDS))}, "
                             f"got {strikes!r}")  # fmt: skip
        object.__setattr__(self, "strike_on_warnings", tuple(strikes))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PolicyConfig:
        """From a config file's ``policy`` table; unknown keys are errors (a typo must not silently do nothing)."""
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ValueError(f"policy.{key}: unknown setting; known settings: {', '.join(sorted(known))}")
        return cls(**dict(data))


def _positive(config: PolicyConfig, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"policy.{name} must be a positive number of seconds, got {value!r}")


def _non_negative(config: PolicyConfig, *names: str) -> None:
    for name in names:
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"policy.{name} must be a number of seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class Action:
    kind: str
    tier: str | None = None
    target: tuple[str, ...] = ()  # nodes, or ranks as text
    reason: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)

    def to_event(self, t: float) -> ev.Event:
        return ev.action_event(t, self.kind, self.tier, self.target, self.reason, self.params)


@dataclass(frozen=True)
class History:
    """What the campaign has been through, folded from the journal (see :meth:`fold`)."""

    streaks: Mapping[str, int] = field(default_factory=dict)  # interruptions per class since progress
    totals: Mapping[str, int] = field(default_factory=dict)
    fault_times: tuple[float, ...] = ()
    faults_since_progress: int = 0
    # The newest restore point: a committed checkpoint, or a memory snapshot a launch resumed from or the job
    # flushed (the tier keeps the work since the filesystem checkpoint, docs/checkpoints.md).
    best_step: int | None = None
    # Where each app error of the campaign happened (the interruption's origin_nodes), oldest first: the input
    # of the "repeats on one node only" blame rule (classify.Evidence.app_error_history).
    app_error_origins: tuple[tuple[str, ...], ...] = ()
    app_error_ranks: tuple[tuple[int, ...], ...] = ()  # their ranks (origin_ranks; () unknown), aligned

    def record(self, interruption_class: str, t: float, origin_nodes: Iterable[str] = (),
               origin_ranks: Iterable[int] = ()) -> History:  # fmt: skip
        if interruption_class == ev.COMPLETED:
            return self
        origins, ranks = self.app_error_origins, self.app_error_ranks
        if interruption_class == ev.APP_ERROR:
            origins = (*origins[-63:], tuple(sorted(set(origin_nodes))))
            ranks = (*ranks[-63:], tuple(sorted(set(origin_ranks))))
        streaks = dict(self.streaks)
        streaks[interruption_class] = streaks.get(interruption_class, 0) + 1
        totals = dict(self.totals)
        totals[interruption_class] = totals.get(interruption_class, 0) + 1
        fault = interruption_class in FAULT_CLASSES
        return replace(
            self,
            streaks=streaks,
            totals=totals,
            fault_times=self.fault_times + ((t,) if fault else ()),
            faults_since_progress=self.faults_since_progress + (1 if fault else 0),
            app_error_origins=origins,
            app_error_ranks=ranks,
        )

    def progress(self, step: int) -> History:
        """A restore point at ``step``: only a newer step than before counts as progress. Why memory snapshots
        count too: with the memory tier a relaunch keeps the work since the filesystem checkpoint, so faults on
        different nodes minutes apart are not a loop; at 131,072 GPUs (a fault every 23 min) counting only
        filesystem checkpoints stopped a simulated campaign 11 times for a person over hardware faults on 4
        different nodes in a row (docs/goodput.md). A program that fails at the same step again resumes from the
        same snapshot each time: no newer step, so the budget still ends a crash loop."""
        if self.best_step is not None and step <= self.best_step:
            return self
        return replace(self, streaks={}, faults_since_progress=0, best_step=step)

    def faults_within(self, window_s: float, now: float) -> int:
        return sum(1 for t in self.fault_times if now - t <= window_s)

    def apply(self, e: Mapping[str, Any]) -> History:
        """Fold one journal event in (``campaign_state.fold`` calls this; unknown events change nothing)."""
        if e.get("type") == ev.INTERRUPTION and e.get("class") in ev.OUTCOMES:
            origin = e.get("origin_nodes")
            nodes = [str(n) for n in origin] if isinstance(origin, list) else []
            got = e.get("origin_ranks")
            ranks = [int(r) for r in got if isinstance(r, int)] if isinstance(got, list) else []
            return self.record(str(e["class"]), float(e.get("t", 0.0)), nodes, ranks)
        if e.get("type") in RESTORE_POINTS and isinstance(e.get("step"), int) and not isinstance(e["step"], bool):
            return self.progress(int(e["step"]))
        return self

    @classmethod
    def fold(cls, events: Iterable[Mapping[str, Any]]) -> History:
        history = cls()
        for e in events:
            history = history.apply(e)
        return history


@dataclass(frozen=True)
class Allocation:
    """Where the campaign stands in Slurm right now."""

    nodes: tuple[str, ...]  # nodes of the current allocation
    needed: int  # nodes the training step needs
    excluded: frozenset[str] = frozenset()  # the ledger's excluded nodes
    step_running: bool = False  # the training step is still up (something to checkpoint, dump, kill)
    slurm_requeues: bool = False  # Slurm is already requeueing the job (preemption, node failure with --requeue)
    restarts_here: int = 0  # relaunches of the training step already done in this allocation
    min_needed: int | None = None  # the training can go on with this few nodes when spares run out ([run] min_nodes)
    node_loss_ends_job: bool = False  # Slurm ends this job when one of its nodes fails (no --no-kill)


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    state: str  # campaign state afterwards: running | pending | completed | failed | held | stopped
    message: str  # one line for the user


def backoff_seconds(faults_since_progress: int, config: PolicyConfig) -> float:
    """0 for the first fault since progress, then base, base*factor, ... capped at max."""
    if faults_since_progress <= 1:
        return 0.0
    exponent = min(faults_since_progress - 2, 64)
    return float(min(config.backoff_max_s, config.backoff_base_s * config.backoff_factor**exponent))


def _tier_actions(cls: str, tier: str, i: Interruption, alloc: Allocation, config: PolicyConfig) -> list[Action]:
    why = f"{cls}: {i.evidence[0] if i.evidence else 'no evidence'}"
    actions = [Action(ALERT, tier, i.blamed_nodes, why, {"class": cls, "confidence": i.confidence})]
    if tier == "L3" and alloc.step_running:
        checkpoint = cls != ev.NUMERICAL or config.checkpoint_on_numerical
        actions.append(Action(STOP_STEP, tier, (), why, {"checkpoint": checkpoint, "grace_s": config.stop_grace_s}))
    if tier == "L4" and alloc.step_running:
        actions.append(Action(DUMP_STACKS, tier, (), why))
        actions.append(Action(KILL_STEP, tier, (), why))
    # Draining takes a node from every user of the site: only on a witness beyond the program's own output (Slurm,
    # a node agent's health check); a rank's printed Xid excludes its node from this campaign alone.
    if config.operator_mode and i.blamed_nodes and cls in (ev.NODE_FAILURE, ev.HARDWARE) and i.beyond_the_program:
        actions.append(Action(DRAIN, tier, i.blamed_nodes, f"supervisor: {cls}"))
    return actions


def over_budget(cls: str, history: History, config: PolicyConfig, now: float) -> str | None:
    """Why ``cls`` may not be restarted again (its budget, or a crash loop of faults), None while it may."""
    return _over_budget(cls, history, config, now)


def _over_budget(cls: str, history: History, config: PolicyConfig, now: float) -> str | None:
    budget = config.budgets.get(cls)
    streak = history.streaks.get(cls, 0)  # already includes this interruption
    if budget is not None and streak > budget:
        if budget == 0:
            return f"{cls} is not restarted by policy (budget 0)"
        return f"{cls} happened {streak} times without progress (budget: {budget} restarts)"
    recent = history.faults_within(config.restart_window_s, now)
    if cls in FAULT_CLASSES and recent > config.max_fault_restarts:
        return f"{recent} faults within {config.restart_window_s:.0f}s (limit {config.max_fault_restarts}): a crash loop"
    return None


_ADVICE = {
    ev.APP_ERROR: "the program itself fails: fix the error in the logs, then resubmit (training resumes from the "
    "last valid checkpoint)",
    ev.NUMERICAL: "the loss became NaN/Inf again after rolling back to before it (skipping the batches seen since); "
    "no checkpoint of it was requested and checkpoints saved after the last finite loss are quarantined; lower the "
    "learning rate or check the data, then resubmit (it resumes from the last good checkpoint)",
    ev.HANG: "the program keeps hanging: read the saved stack dumps in the campaign dir",
    ev.CANCELLED: "the job was cancelled from outside",
    ev.TIMEOUT: "no new checkpoint was committed between time limits: checkpoint more often, raise --time, or "
    "check that checkpoints succeed",
}


@lru_cache(maxsize=4)
def _node_index(nodes: tuple[str, ...]) -> Mapping[str, int]:
    """Node -> its position in an allocation (empty when a node is listed twice). Cached: a simulated
    131,072-GPU campaign decides thousands of times on the same 16,384 nodes."""
    index = dict(zip(nodes, range(len(nodes)), strict=True))
    return MappingProxyType(index if len(index) == len(nodes) else {})


def _without(nodes: tuple[str, ...], dropped: set[str]) -> list[str]:
    """``nodes`` in order without ``dropped`` (some of them): slices between their positions, not a pass over
    every node."""
    index = _node_index(nodes)
    if not index:
        return [n for n in nodes if n not in dropped]
    kept: list[str] = []
    prev = 0
    for at in sorted(index[n] for n in dropped):
        kept.extend(nodes[prev:at])
        prev = at + 1
    kept.extend(nodes[prev:])
    return kept


def decide(
    interruption: Interruption,
    history: History,
    allocation: Allocation,
    config: PolicyConfig | None = None,
    now: float = 0.0,
) -> Decision:
    """``history`` must not yet include ``interruption`` (it is recorded here)."""
    config = config or PolicyConfig()
    cls = interruption.cls
    if cls == ev.COMPLETED:
        return Decision((Action(FINISH, None, (), "the run completed"),), "completed", "training completed")
    history = history.record(cls, now)
    tier = config.tiers[cls]
    actions = _tier_actions(cls, tier, interruption, allocation, config)
    exclude = sorted(set(interruption.blamed_nodes) | set(allocation.excluded))
    if cls == ev.CANCELLED:
        actions.append(Action(STOP, None, (), "cancelled from outside", {"state": "stopped"}))
        return Decision(tuple(actions), "stopped", "the job was cancelled from outside; the campaign is stopped")
    exhausted = _over_budget(cls, history, config, now)
    if exhausted:
        advice = _ADVICE.get(cls, "look at the report and the logs, then resubmit")
        message = f"stopping: {exhausted}; {advice}"
        if allocation.step_running and not any(a.kind in (STOP_STEP, KILL_STEP) for a in actions):
            checkpoint = cls != ev.NUMERICAL or config.checkpoint_on_numerical
            actions.append(Action(STOP_STEP, "L3", (), message,
                                  {"checkpoint": checkpoint, "grace_s": config.stop_grace_s}))  # fmt: skip
        first = actions[0]  # the tier's alert: raise it to at least L3 and say why the campaign stops
        actions[0] = replace(first, tier=max(first.tier or "L3", "L3"), reason=f"{first.reason}; {message}")
        actions += _keep_memory(cls, actions, exclude)
        if config.on_budget_exhausted == "hold":
            actions.append(Action(HOLD, None, tuple(exclude), message, {"exclude": exclude}))
            return Decision(tuple(actions), "held", message)
        actions.append(Action(STOP, None, (), message, {"state": "failed"}))
        return Decision(tuple(actions), "failed", message)
    if cls == ev.PREEMPTION:
        if allocation.step_running:
            actions.append(Action(CHECKPOINT_NOW, None, (), "preempted: save before the grace time ends"))
        else:
            actions.append(Action(FLUSH_MEMORY, None, (), "preempted after the ranks ended: flush memory"))
        actions.append(Action(AWAIT_REQUEUE, None, (), "Slurm requeues a preempted job", {"exclude": exclude}))
        return Decision(tuple(actions), "pending", "preempted: checkpointing; Slurm will requeue the job")
    if cls == ev.TIMEOUT:
        if allocation.step_running:
            actions.append(Action(CHECKPOINT_NOW, None, (), "time limit near: save, then requeue"))
        else:
            actions.append(Action(FLUSH_MEMORY, None, (), "time limit after the ranks ended: flush memory"))
        actions.append(Action(REQUEUE, None, tuple(exclude), "time limit: continue in a new allocation",
                              {"exclude": exclude, "after_checkpoint": allocation.step_running}))  # fmt: skip
        return Decision(tuple(actions), "pending", "time limit reached: checkpointing and requeueing")
    wait = backoff_seconds(history.faults_since_progress, config)
    if wait > 0:
        actions.append(Action(BACKOFF, None, (), f"fault {history.faults_since_progress} since progress",
                              {"seconds": wait}))  # fmt: skip
    # Nodes blamed for a node failure, a hardware fault or an app error that keeps to them, and the ledger's
    # excluded nodes (struck too often, or broken hardware), are never relaunched on: without enough other nodes
    # here the job is requeued without them, and Slurm gives healthy ones. Only this interruption's soft suspects
    # (a hang's or comm error's node, not yet excluded by the ledger) are reused when no spare is left.
    blamed_hard = set(interruption.blamed_nodes) if cls in HARD_BLAME else set()
    hard = blamed_hard | set(allocation.excluded)
    # the nodes left out here first: usually none or a few of the allocation, whose every pass at 16k nodes
    # costs ~0.5 ms (a simulated 131,072-GPU campaign decides thousands of times)
    nodes = tuple(allocation.nodes)  # the same object when it is one already (hashed for the cache)
    in_allocation = _node_index(nodes) or set(nodes)
    dropped = {n for n in exclude if n in in_allocation}
    usable = _without(nodes, dropped)
    if len(usable) < allocation.needed:
        dropped = {n for n in hard if n in in_allocation}
        usable = _without(nodes, dropped)
    if allocation.slurm_requeues:
        actions.append(Action(AWAIT_REQUEUE, None, tuple(exclude), f"{cls}: Slurm requeues the job",
                              {"exclude": exclude}))  # fmt: skip
        return Decision(tuple(actions), "pending", f"{cls}: Slurm is requeueing the job")
    if cls == ev.NODE_FAILURE and blamed_hard & set(allocation.nodes) and allocation.node_loss_ends_job:
        # Slurm ends the whole job once it marks the node DOWN: requeue now, without it, rather than wait.
        actions += _keep_memory(cls, actions, exclude)
        actions.append(Action(REQUEUE, None, tuple(exclude), f"{cls}: the job cannot outlive the node (no "
                              "--no-kill): requeue now", {"exclude": exclude, "after_checkpoint": False}))  # fmt: skip
        return Decision(tuple(actions), "pending", f"{cls}: requeueing without {', '.join(exclude)}")
    floor = allocation.needed if not allocation.min_needed else min(allocation.needed, allocation.min_needed)
    # Relaunches here that did not lead to progress (a new checkpoint): a few in a row suggest the allocation
    # itself is bad (a switch, a filesystem mount) and a new one is worth the queue wait; relaunches that each
    # made progress do not (over weeks, counting them all would requeue after every third fault).
    stuck_here = min(allocation.restarts_here, history.faults_since_progress - 1)
    if len(usable) >= floor and stuck_here < config.max_restarts_in_allocation:
        excluded_here = sorted(dropped)  # sorted, like a requeue's exclude list
        # A diverged loss: the relaunch resumes from before the divergence and skips the batches seen since.
        rollback = {"rollback": True} if cls == ev.NUMERICAL else {}
        if len(usable) < allocation.needed:  # spares used up: [run] min_nodes says the training can go on
            why = f"{cls}: spares used up, relaunch on {len(usable)} of {allocation.needed} nodes (min_nodes {floor})"
            actions.append(Action(RESTART_IN_ALLOCATION, None, tuple(usable), why,
                                  {"exclude": excluded_here, "nodes": usable, "fewer_nodes": True, **rollback}))  # fmt: skip
            return Decision(tuple(actions), "running", why)
        what = "roll back to before the divergence, skipping its batches" if rollback else "relaunch in this allocation"
        actions.append(Action(RESTART_IN_ALLOCATION, None, tuple(usable), f"{cls}: {what}",
                              {"exclude": excluded_here, "nodes": usable, **rollback}))  # fmt: skip
        return Decision(tuple(actions), "running", f"{cls}: {what}")
    why = "not enough healthy nodes here" if len(usable) < floor else (
        f"{stuck_here} restarts in this allocation without progress")
    actions += _keep_memory(cls, actions, exclude)
    actions.append(Action(REQUEUE, None, tuple(exclude), f"{cls}: {why}, requeue",
                          {"exclude": exclude, "after_checkpoint": False}))  # fmt: skip
    return Decision(tuple(actions), "pending", f"{cls}: requeueing without {', '.join(exclude) or 'any exclusion'}")


def _keep_memory(cls: str, actions: Sequence[Action], exclude: Sequence[str]) -> list[Action]:
    """Before a fault makes the job let go of its nodes (a requeue, a stop for a person): the node agents copy the
    newest memory snapshot to the filesystem, the lost node's shards from its buddy (``exclude``: the nodes not to
    ask), so the next job resumes from it rather than from the older filesystem checkpoint. Not after a NaN (the
    newest snapshot may hold the diverged state) nor where a save-and-stop already flushes beside the ranks' save."""
    if cls == ev.NUMERICAL or any(a.kind == STOP_STEP and a.params.get("checkpoint") for a in actions):
        return []
    return [Action(FLUSH_MEMORY, None, (), f"{cls}: keep the newest memory snapshot for the next job",
                   {"exclude": list(exclude)})]  # fmt: skip


_WARNING_ADVICE = {
    STRAGGLER: "the node is struck in the ledger; if it persists it is left out at the next restart (or drain it)",
    LOSS_SPIKE: "watch the loss; roll back to an earlier checkpoint if it does not recover",
}


def respond_to_warning(warning: DetectionEvent, config: PolicyConfig | None = None) -> tuple[Action, ...]:
    """The one response to a warning detection (straggler, loss spike): the run goes on; an L2 alert says what
    was seen and what to do, and for the warnings in ``strike_on_warnings`` a MARK_SUSPECT strikes the nodes
    (the ledger weighs the strike by ``ledger.weights.<kind>``). Anything else (a fault) gets no actions here."""
    config = config or PolicyConfig()
    if warning.kind not in WARNING_KINDS:
        return ()
    evidence = warning.evidence[0] if warning.evidence else warning.kind
    advice = _WARNING_ADVICE.get(warning.kind, "look at the live status")
    ranks = list(warning.ranks)
    actions = [Action(ALERT, "L2", warning.nodes, f"{warning.kind}: {evidence}",
                      {"warning": warning.kind, "ranks": ranks, "suggested_action": advice})]  # fmt: skip
    if warning.nodes and warning.kind in config.strike_on_warnings:
        actions.append(Action(MARK_SUSPECT, "L2", warning.nodes, f"{warning.kind}: {evidence}",
                              {"strike": warning.kind, "ranks": ranks}))  # fmt: skip
    return tuple(actions)

"""Alerts people can act on: what was measured, against which threshold, for how long, where, and what was done.

Two halves, so the supervision loop never waits on a network:

* :func:`build` (pure) turns a policy action plus the interruption and detections behind it into an
  :class:`Alert` whose fields are never empty: a detection gives metric/value/threshold/duration; an
  interruption without one (a preemption, a crash seen through an exit code) is described by how often its
  class happened since the last checkpoint progress against the policy's budget, and for how long the step ran.
* :class:`Dispatcher` delivers alerts from a worker thread through a bounded queue: deduplicated by
  (class, nodes) within a cooldown (a burst of the same straggler warning is one message, counted), retried
  with backoff (tenacity), escalated (tier >= ``escalate_tier`` also goes to the escalation sinks). A sink that
  answers garbage, errors or hangs costs the worker at most its timeout per try and never raises into, nor
  blocks, the caller.

Sinks (``alert_sinks.py``): a webhook, a command, optionally any service apprise knows; and the log (always, on
the caller's thread, so the journal-side record exists even when the queue is full; repeats within the cooldown
are debug lines).
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import structlog
import tenacity

from supervisor.alert_sinks import Sink, SinkError, sinks_from_config

log = structlog.get_logger("supervisor.alerts")

TIERS = ("L1", "L2", "L3", "L4")
NOT_MEASURED = "not measured"  # a field the evidence does not give: said, never left blank

# What the policy does at each tier (the fallback "action taken" when the caller does not list the actions).
TIER_ACTIONS = {
    "L1": "logged",
    "L2": "alerted; the run goes on",
    "L3": "asked every rank to checkpoint and stop",
    "L4": "saved stacks, killed the step, marked the nodes suspect",
}

# Class-specific advice when the policy gave none.
ADVICE = {
    "preemption": "nothing to do: the job checkpoints and Slurm requeues it",
    "timeout": "nothing to do unless it repeats without a new checkpoint: then checkpoint more often or raise --time",
    "node_failure": "check the node (slurmd log, dmesg); `scontrol update nodename=N state=resume` after a repair",
    "hardware": "drain the node and check the GPU (nvidia-smi -q, dmesg Xid lines); reset or replace it",
    "hang": "read the saved stacks in the campaign's stacks/ directory",
    "comm_error": "check the network fabric (NCCL logs, link errors) between the named nodes",
    "app_error": "read the training log: the program itself failed",
    "numerical": "lower the learning rate or check the data; resume from the last good checkpoint",
    "cancelled": "nothing: the job was cancelled from outside",
    "unknown": "read the training log and `supervise report`",
    "straggler": "if it persists, drain or exclude the node at the next restart",
    "loss_spike": "watch the loss; roll back to an earlier checkpoint if it does not recover",
}


@dataclasses.dataclass(frozen=True)
class Alert:
    """One alert; every field is filled (``NOT_MEASURED`` where the evidence says nothing)."""

    t: float
    job_id: str
    campaign: str
    cls: str
    tier: str
    nodes: tuple[str, ...]
    metric: str
    value: Any
    threshold: Any
    duration_s: Any
    action_taken: str
    message: str
    suggested_action: str
    repeats: int = 0  # identical alerts suppressed by the cooldown since the last one sent

    @property
    def key(self) -> tuple[str, tuple[str, ...]]:
        return (self.cls, self.nodes)

    def to_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["class"] = doc.pop("cls")
        doc["nodes"] = list(self.nodes)
        return doc

    def summary(self) -> str:
        where = ", ".join(self.nodes) or "all nodes"
        return (f"[{self.tier}] {self.cls} on {where} (job {self.job_id}): {self.metric} = {self.value} "
                f"(threshold {self.threshold}, for {self.duration_s} s); action: {self.action_taken}; "
                f"next: {self.suggested_action}") + (f" [+{self.repeats} repeats]" if self.repeats else "")

    def empty_fields(self) -> list[str]:
        return [k for k, v in self.to_dict().items() if k != "repeats" and (v is None or v == "" or v == [])
                and not (k == "nodes" and self.cls in _NO_NODE_CLASSES)]  # fmt: skip


# Classes that are about the job, not a node: "all nodes" is their honest scope.
_NO_NODE_CLASSES = frozenset({"preemption", "timeout", "cancelled", "numerical", "app_error", "loss_spike", "unknown"})


def _filled(value: Any) -> Any:
    if value is None or value == "":
        return NOT_MEASURED
    if isinstance(value, float):
        return round(value, 3)
    return value


def build(
    job_id: str,
    campaign: str,
    action: Mapping[str, Any],
    detections: Sequence[Mapping[str, Any]] = (),
    interruption: Mapping[str, Any] | None = None,
    *,
    t: float | None = None,
    streak: int | None = None,
    budget: int | None = None,
    ran_s: float | None = None,
    actions_taken: Sequence[str] = (),
) -> Alert:
    """An alert from the journal's action event (``policy.Action.to_event``) and what led to it.

    ``streak``/``budget``: this class's interruptions since the last checkpoint progress and the policy's budget
    (used when no detection measured anything); ``ran_s``: how long the step ran before it stopped;
    ``actions_taken``: the decision's other action kinds (default: what the tier does).
    """
    params = action.get("params") or {}
    interruption = interruption or {}
    cls = str(params.get("class") or params.get("warning") or interruption.get("class") or "unknown")
    tier = str(action.get("tier") or "L2")
    nodes = tuple(sorted({str(n) for n in (action.get("target") or interruption.get("blamed_nodes") or ())}))
    det = _best_detection(detections, cls)
    if det is not None:
        metric = str(det.get("metric") or det.get("kind") or cls)
        value, threshold, duration = det.get("value"), det.get("threshold"), det.get("duration_s")
        if not nodes:
            nodes = tuple(sorted({str(n) for n in det.get("nodes") or ()}))
    else:
        metric = f"{cls} interruptions since the last checkpoint progress"
        value = streak if streak is not None else 1
        threshold = "no limit" if budget is None and streak is not None else (
            f"budget {budget} restarts" if budget is not None else NOT_MEASURED)
        duration = ran_s
    evidence = list(interruption.get("evidence") or ())
    message = str(action.get("reason") or (evidence[0] if evidence else "") or f"{cls} detected")
    taken = ", ".join(k for k in actions_taken if k != "alert") or TIER_ACTIONS.get(tier, "logged")
    suggestion = str(params.get("suggested_action") or ADVICE.get(cls, ADVICE["unknown"]))
    return Alert(
        t=float(t) if t is not None else float(action.get("t") or time.time()),
        job_id=str(job_id or NOT_MEASURED), campaign=str(campaign or NOT_MEASURED), cls=cls, tier=tier,
        nodes=nodes, metric=metric, value=_filled(value), threshold=_filled(threshold),
        duration_s=_filled(duration), action_taken=taken, message=message, suggested_action=suggestion,
    )  # fmt: skip


def for_decision(
    job_id: str,
    campaign: str,
    decision: Any,
    interruption: Any = None,
    detections: Sequence[Mapping[str, Any]] = (),
    *,
    history: Any = None,
    budgets: Mapping[str, int | None] | None = None,
    ran_s: float | None = None,
    t: float | None = None,
) -> Alert | None:
    """The alert for a ``policy.Decision`` (None when it has no alert action): the loop's one call.
    ``interruption``: the ``classify.Interruption``; ``history``: the ``policy.History`` *before* this
    interruption (its streak for the class, plus this one); ``budgets``: ``PolicyConfig.budgets``."""
    action = next((a for a in decision.actions if a.kind == "alert"), None)
    if action is None:
        return None
    event = action.to_event(t if t is not None else time.time())
    cls = str(event["params"].get("class") or "")
    streak = None
    if history is not None and cls:
        streak = int(history.streaks.get(cls, 0)) + 1
    budget = budgets.get(cls) if budgets is not None and cls else None
    interruption_doc = interruption.to_event(event["t"]) if interruption is not None else None
    return build(job_id, campaign, event, detections, interruption_doc, t=event["t"], streak=streak, budget=budget,
                 ran_s=ran_s, actions_taken=[a.kind for a in decision.actions])


def _best_detection(detections: Sequence[Mapping[str, Any]], cls: str) -> Mapping[str, Any] | None:
    """The detection that measured something, preferring one whose kind names the class (a straggler alert
    comes with its straggler detection)."""
    measured = [d for d in detections if d.get("metric")]
    for d in measured:
        if d.get("kind") == cls:
            return d
    return measured[0] if measured else None


def tier_at_least(tier: str, floor: str) -> bool:
    return tier in TIERS and floor in TIERS and TIERS.index(tier) >= TIERS.index(floor)


# ------------------------------------------------------------------------------------------------ dispatcher


@dataclasses.dataclass
class _Sent:
    at: float
    tier: str
    suppressed: int = 0


class Dispatcher:
    """Off-path delivery: :meth:`submit` returns at once; a daemon thread sends, retries and gives up quietly.

    ``submit`` is safe from any thread and never raises (a full queue drops the alert, counted and logged).
    """

    def __init__(
        self,
        primary: Iterable[Sink] = (),
        escalation: Iterable[Sink] = (),
        *,
        cooldown_s: float = 300.0,
        escalate_tier: str = "L3",
        min_tier: str = "L2",
        queue_size: int = 100,
        retries: int = 3,
        retry_wait_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.primary, self.escalation = list(primary), list(escalation)
        self.cooldown_s, self.escalate_tier, self.min_tier = cooldown_s, escalate_tier, min_tier
        self.retries, self.retry_wait_s, self.clock = max(1, retries), retry_wait_s, clock
        self._queue: queue.Queue[Alert | None] = queue.Queue(maxsize=max(1, queue_size))
        self._lock = threading.Lock()
        self._sent: dict[tuple[str, tuple[str, ...]], _Sent] = {}
        self.stats = {"submitted": 0, "suppressed": 0, "dropped": 0, "delivered": 0, "failed": 0}
        self._thread = threading.Thread(target=self._work, name="supervise-alerts", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: Any, **kwargs: Any) -> Dispatcher:
        primary, escalation = sinks_from_config(config)
        for name in ("cooldown_s", "escalate_tier", "queue_size", "retries"):
            if hasattr(config, name):
                kwargs.setdefault(name, getattr(config, name))
        return cls(primary, escalation, **kwargs)

    def submit(self, alert: Alert) -> bool:
        """Queue ``alert`` for delivery; False when it was suppressed (cooldown), below ``min_tier``, or dropped."""
        try:
            return self._submit(alert)
        except Exception as err:  # noqa: BLE001 - alerting must never take the supervisor down
            log.warning("alert_submit_failed", error=f"{type(err).__name__}: {err}")
            return False

    def _submit(self, alert: Alert) -> bool:
        self.stats["submitted"] += 1
        if not tier_at_least(alert.tier, self.min_tier):
            log.info("alert", **alert.to_dict())  # L1: the log is its only sink
            return False
        now = self.clock()
        with self._lock:
            last = self._sent.get(alert.key)
            escalated = last is not None and tier_at_least(alert.tier, last.tier) and alert.tier != last.tier
            if last is not None and now - last.at < self.cooldown_s and not escalated:
                last.suppressed += 1
                self.stats["suppressed"] += 1
                log.debug("alert_suppressed", cls=alert.cls, nodes=list(alert.nodes), repeats=last.suppressed)
                return False
            repeats = last.suppressed if last is not None else 0
            self._sent[alert.key] = _Sent(now, alert.tier)
        log.warning("alert", **{**alert.to_dict(), "repeats": repeats})  # the log sink: on the caller's thread
        try:
            self._queue.put_nowait(dataclasses.replace(alert, repeats=repeats))
        except queue.Full:
            self.stats["dropped"] += 1
            log.warning("alert_dropped", reason="alert queue full (sinks too slow)", cls=alert.cls)
            return False
        return True

    def _work(self) -> None:
        while True:
            alert = self._queue.get()
            try:
                if alert is None:
                    return
                sinks = list(self.primary)
                if tier_at_least(alert.tier, self.escalate_tier):
                    sinks += self.escalation
                for sink in sinks:
                    self._deliver(sink, alert)
            finally:
                self._queue.task_done()

    def _deliver(self, sink: Sink, alert: Alert) -> None:
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries),
            wait=tenacity.wait_exponential(multiplier=self.retry_wait_s, max=30.0),
            retry=tenacity.retry_if_exception_type(Exception),
            reraise=True,
        )
        try:
            retrying(sink.send, alert)
            self.stats["delivered"] += 1
        except Exception as err:  # noqa: BLE001 - a sink's failure is logged, never raised
            self.stats["failed"] += 1
            log.warning("alert_failed", sink=getattr(sink, "name", "?"), error=str(err), cls=alert.cls)

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until the queue is empty (at most ``timeout_s``); True when everything queued was attempted."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)
        return not self._queue.unfinished_tasks

    def close(self, timeout_s: float = 10.0) -> None:
        """Send what is queued (bounded by ``timeout_s``), then stop the worker."""
        self.flush(timeout_s)
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            return
        self._thread.join(timeout=max(0.0, timeout_s))


# ------------------------------------------------------------------------------------------------ compatibility


def document(job_id: str, campaign: str, action: Mapping[str, Any], detections: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The alert as a JSON-able dict (the form the webhook and command sinks receive)."""
    return build(job_id, campaign, action, detections).to_dict()


def send(config: Any, doc: Mapping[str, Any], timeout_s: float = 5.0) -> list[str]:
    """Synchronous delivery of one document to the configured webhook/command (kept for callers not yet on
    :class:`Dispatcher`); returns the problems, empty when all went through."""
    fields = {f.name for f in dataclasses.fields(Alert)}
    data = {("cls" if k == "class" else k): v for k, v in doc.items()}
    kwargs: dict[str, Any] = {k: (tuple(v) if k == "nodes" else v) for k, v in data.items() if k in fields}
    alert = Alert(**kwargs)
    problems: list[str] = []
    try:
        primary, _ = sinks_from_config(config)
    except ValueError as err:
        return [str(err)]
    for sink in primary:
        try:
            sink.send(alert)
        except SinkError as err:
            problems.append(str(err))
    for problem in problems:
        log.warning("alert_failed", problem=problem)
    return problems


def validate_config(config: Any) -> None:
    """Check ``[alerts]`` beyond types: tiers, positive finite times, URLs and commands the sinks accept."""
    import math

    if config.escalate_tier not in TIERS:
        raise ValueError(f"alerts.escalate_tier = {config.escalate_tier!r}: use one of {', '.join(TIERS)}")
    for name, upper in (("cooldown_s", 7 * 86400.0), ("timeout_s", 300.0)):
        value = getattr(config, name)
        if not (math.isfinite(value) and 0 < value <= upper) and not (name == "cooldown_s" and value == 0):
            raise ValueError(f"alerts.{name} = {value!r}: use a number of seconds in (0, {upper:g}]")
    for name, lo, hi in (("retries", 1, 20), ("queue_size", 1, 100_000)):
        value = getattr(config, name)
        if not lo <= value <= hi:
            raise ValueError(f"alerts.{name} = {value!r}: use a whole number in [{lo}, {hi}]")
    sinks_from_config(config)  # URLs, commands, apprise availability

"""What people see and hear while the campaign runs: warnings answered by the policy, alerts sent off the
supervision path, the Prometheus endpoint fed each pass.

* A warning detection (persistent straggler, loss spike) gets ``policy.respond_to_warning``: its actions are
  journaled (the ledger folds ``mark_suspect`` from the journal; nothing else to do for it) and an ``alert`` goes
  to the dispatcher. The run goes on.
* Alerts go through one ``alerts.Dispatcher`` (a worker thread with a bounded queue, dedup/cooldown, retries,
  escalation): a slow or broken sink never blocks nor ends the loop.
* ``metrics.start`` (off unless ``[metrics] listen`` is set) is fed the live snapshot and the campaign state each
  pass.

Each part that fails is journaled as ``supervisor_error`` (``driver.guard``) and the loop goes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from supervisor import alerts, metrics
from supervisor.decisions import policy
from supervisor.decisions.campaign_state import CampaignState
from supervisor.decisions.detect import DetectionEvent
from supervisor.driver.context import Context
from supervisor.driver.guard import METRICS, WARNING


class Notifier:
    def __init__(self, ctx: Context, *, alerts_config: Any, metrics_config: metrics.MetricsConfig,
                 policy_config: policy.PolicyConfig, job_id: str, campaign: str, state: CampaignState) -> None:  # fmt: skip
        """``state``: the campaign state the loop keeps (what the metrics endpoint shows besides the live table)."""
        self.ctx, self.record, self.clock, self.guard = ctx, ctx.record, ctx.clock, ctx.guard
        self.policy_config, self.job_id, self.campaign, self.state = policy_config, job_id, campaign, state
        self.dispatcher: alerts.Dispatcher = self.guard.call(
            "alerts", alerts.Dispatcher.from_config, alerts_config, default=None) or alerts.Dispatcher()
        self.metrics: metrics.Metrics | None = self.guard.call(METRICS, metrics.start, metrics_config, campaign,
                                                               job_id, default=None)  # fmt: skip

    def submit(self, alert: alerts.Alert | None) -> None:
        if alert is not None:
            self.dispatcher.submit(alert)  # never raises, never blocks

    def warning(self, detection: DetectionEvent) -> None:
        """The policy's response to a warning: journaled, its alert sent; the run goes on."""
        self.guard.call(WARNING, self._warning, detection, default=None)

    def _warning(self, detection: DetectionEvent) -> None:
        actions = policy.respond_to_warning(detection, self.policy_config)
        kinds = [a.kind for a in actions]
        for action in actions:
            event = action.to_event(self.clock())
            self.record(event)  # MARK_SUSPECT: journaled only, the ledger folds it
            if action.kind == policy.ALERT:
                self.submit(alerts.build(self.job_id, self.campaign, event, [detection.to_dict()],
                                         t=event["t"], actions_taken=kinds))  # fmt: skip

    def health(self, node: str, items: Sequence[Any]) -> None:
        """A node agent found new problems (``wire.HealthItem``s): one alert, journaled as its action. Fatal:
        L3 (the node is left out of the next launch, unless it is short of space; one in the running launch also ends it, with its own L4
        alert); warnings (throttling, heat, memory pressure, clock): L2. Class ``hardware`` for a fatal GPU finding,
        else ``health``. Its metric, value and threshold are the first finding's, the suggested action its fix."""
        self.guard.call(WARNING, self._health, node, items, default=None)

    def _health(self, node: str, items: Sequence[Any]) -> None:
        from supervisor.driver.health_watch import CAPACITY_CHECK_PREFIXES, as_detection

        first = sorted(items, key=lambda i: i.severity != "fatal")[0]
        fatal = first.severity == "fatal"
        more = f" (+{len(items) - 1} more)" if len(items) > 1 else ""
        gpu = first.check.startswith(("gpu", "xid"))  # a full disk or a skewed clock is the node's, not hardware
        capacity = first.check.startswith(CAPACITY_CHECK_PREFIXES)  # space: alerted, the node stays in use
        action = policy.Action(policy.ALERT, "L3" if fatal else "L2", (node,), f"health on {node}: {first.what}{more}",
                               {"class": "hardware" if fatal and gpu else "health", "suggested_action": first.fix})  # fmt: skip
        event = action.to_event(self.clock())
        self.record(event)
        self.submit(alerts.build(self.job_id, self.campaign, event, [as_detection(node, first)], t=event["t"],
                                 actions_taken=["node left out of the next launch" if fatal and not capacity
                                                else "journaled"]))  # fmt: skip

    def env_changed(self, checkpoint: str, differences: tuple[str, ...], nodes: tuple[str, ...]) -> None:
        """A launch (on ``nodes``) resumed in another environment than its checkpoint's: one L2 alert, journaled as
        its action."""
        self.guard.call(WARNING, self._env_changed, checkpoint, differences, nodes, default=None)

    def _env_changed(self, checkpoint: str, differences: tuple[str, ...], nodes: tuple[str, ...]) -> None:
        action = policy.Action(policy.ALERT, "L2", tuple(nodes), f"resumed from {checkpoint} in another environment than the one "
                               f"that wrote it: {'; '.join(differences)}",
                               {"class": "environment", "suggested_action": "if the change was not meant, relaunch in "
                                "the checkpoint's environment; if it was, watch the loss and the step time"})  # fmt: skip
        event = action.to_event(self.clock())
        self.record(event)
        detection = {"kind": "environment", "metric": "environment", "value": "; ".join(differences),
                     "threshold": "the checkpoint's fingerprint", "nodes": list(nodes), "evidence": list(differences)}  # fmt: skip
        self.submit(alerts.build(self.job_id, self.campaign, event, [detection], t=event["t"],
                                 actions_taken=["journaled; the run goes on"]))  # fmt: skip

    def update_metrics(self, channel: Any) -> None:
        """Feed the metrics endpoint (when on) the heartbeat channel's newest snapshot and the campaign state."""
        if self.metrics is not None:
            self.guard.call(METRICS, self._update_metrics, channel, default=None)

    def _update_metrics(self, channel: Any) -> None:
        assert self.metrics is not None
        live = getattr(channel, "latest", None) or channel.table.snapshot()
        self.metrics.update(live, self.state)

    def close(self) -> None:
        if self.metrics is not None:
            self.guard.call(METRICS, self.metrics.close, default=None)
        self.guard.call("alerts", self.dispatcher.close, default=None)

"""Watch one launch until it exits, a detector finds a fault, or the batch step gets a signal.

Feeds the pure detectors with the heartbeat table's snapshot of the launch's ranks (ranks of earlier launches
left out), journals warnings as they come, and keeps the side duties of a running launch: new valid checkpoints
(the campaign's progress), learned timeouts, and the agents' step.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

from supervisor import procstate
from supervisor.decisions import events as ev
from supervisor.decisions.detect import (
    HANG_KINDS,
    NODE_LOST,
    NODE_SILENT,
    RANK_EXITED,
    DetectionEvent,
    Detector,
    snapshot_from_live,
)
from supervisor.decisions.detect.hang import finished_normally
from supervisor.driver.agents import AgentStep
from supervisor.driver.checkpoints import CheckpointTracker
from supervisor.driver.evidence import WatchResult
from supervisor.driver.guard import AGENTS, CHECKPOINT_SCAN, DETECT, HEALTH, SLURM_QUERY, Guard
from supervisor.driver.health import HealthWatch
from supervisor.driver.launcher import Launch
from supervisor.driver.nodeloss import NodeLossWatch
from supervisor.driver.ports import Channel
from supervisor.driver.signals import SignalInbox

CHECKPOINT_SCAN_S = 5.0  # how often the checkpoint directory is looked at for new valid checkpoints
TIMEOUTS_JOURNAL_S = 600.0  # learned timeouts are journaled this often (and whenever a launch ends)
EXIT_GRACE_S = 5.0  # a rank gone while srun still runs for this long is a fault (not a normal finish)
# Every rank of the launch gone while srun still runs: srun is tearing the step down (seconds on a loaded machine);
# its exit code and task report are the evidence, so wait for it this long before calling it a fault.
ALL_EXITED_GRACE_S = 60.0
STOP_CHECK_S = 1.0  # how often the campaign directory is looked at for a user's stop request
PREEMPT_CHECK_S = 0.5  # how often the preemption poller's answer is looked at (driver/preempt_watch.py)
EXIT_SETTLE_S = 0.6  # after srun exits: time for the agents to report how each rank ended


def back_again(pending: list[DetectionEvent], ranks: Any) -> list[DetectionEvent]:
    """``pending`` without the exits of ranks that run again (a live process under the same rank: torchrun
    restarted its workers inside the launch, ``--max-restarts`` > 0; counted from its log at the launch's end)."""
    alive = {r.rank for r in ranks if r.state not in procstate.ENDED}
    return [d for d in pending if not (d.kind == RANK_EXITED and d.ranks and set(d.ranks) <= alive)]


class Watcher:
    def __init__(
        self,
        *,
        channel: Channel,
        detector: Detector,
        inbox: SignalInbox,
        checkpoints: CheckpointTracker,
        agents: AgentStep,
        record: Callable[[dict[str, Any]], None],
        clock: Callable[[], float],
        loop_interval_s: float,
        guard: Guard | None = None,
        stop_requested: Callable[[], bool] | None = None,
        preempted: Callable[[], bool] | None = None,
        time_limit_due: Callable[[], bool] | None = None,
        on_warning: Callable[[DetectionEvent], None] | None = None,
        on_pass: Callable[[], None] | None = None,
        on_live: Callable[[Any], None] | None = None,
        health: HealthWatch | None = None,
        nodeloss: NodeLossWatch | None = None,
    ) -> None:
        self.channel, self.detector, self.inbox = channel, detector, inbox
        self.checkpoints, self.agents, self.record, self.clock = checkpoints, agents, record, clock
        self.loop_interval_s = loop_interval_s
        self.guard = guard or Guard(record, clock)
        self.stop_requested = stop_requested  # the user asked to stop (``supervise cancel``)
        self.preempted = preempted  # Slurm set the job's preempt_time (its signal may never come)
        self.time_limit_due = time_limit_due  # the time limit's USR1 is overdue (driver/time_limit_watch.py)
        self.on_warning, self.on_pass = on_warning, on_pass  # the policy's answer to warnings; metrics
        self.on_live = on_live  # the launch's ranks as seen each pass (goodput records: driver/progress.py)
        self.nodeloss = nodeloss  # our own verdict on silent nodes; it takes precedence over hangs
        self.old_pids: set[int] = set()  # rank pids of earlier launches: their slots linger until overwritten
        self.health = health  # the agents' health reports: a node of the launch found unfit ends the watch

    def forget_ranks(self) -> None:
        """Called before a new launch: the ranks now in the table belong to earlier launches."""
        self.old_pids.update(r.pid for r in self.channel.table.snapshot().ranks)

    def watch(self, launch: Launch) -> WatchResult:
        next_eval = next_scan = next_timeouts = next_stop_check = 0.0
        next_preempt_check = time.monotonic() + PREEMPT_CHECK_S
        exited_since: float | None = None  # a rank exited while srun still runs: normal at the very end
        pending: list[DetectionEvent] = []
        held: list[DetectionEvent] = []  # hangs waiting for the verdict on a quiet node
        while True:
            self.channel.poll(0.1)
            received = self.inbox.drain()
            if received:
                return WatchResult("signal", detections=tuple(pending), signals=tuple(received))
            if self.stop_requested is not None and time.monotonic() >= next_stop_check:
                next_stop_check = time.monotonic() + STOP_CHECK_S
                if self.guard.call(CHECKPOINT_SCAN, self.stop_requested, default=False):
                    return WatchResult("stop_request", detections=tuple(pending))
            if self.preempted is not None and time.monotonic() >= next_preempt_check:
                next_preempt_check = time.monotonic() + PREEMPT_CHECK_S
                if self.guard.call(SLURM_QUERY, self.preempted, default=False):  # Slurm's signal may never come
                    return WatchResult("signal", detections=tuple(pending))  # the evidence reads preempt_time
                if self.time_limit_due is not None and self.guard.call(DETECT, self.time_limit_due, default=False):
                    return WatchResult("signal", detections=tuple(pending), time_limit_near=self.clock())
            code = launch.proc.poll()
            if code is not None:
                self.settle(EXIT_SETTLE_S)
                self.scan_checkpoints()
                found = self.verdict_on_silent_nodes(launch) if code != 0 else []
                return WatchResult("exited", exit_code=code, detections=tuple(pending + found))
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + CHECKPOINT_SCAN_S
                self.scan_checkpoints()
            if now >= next_timeouts:
                if next_timeouts:
                    self.guard.call(DETECT, self.journal_timeouts, default=None)
                next_timeouts = now + TIMEOUTS_JOURNAL_S
            if now < next_eval:
                continue
            next_eval = now + self.loop_interval_s
            if self.on_pass is not None:
                self.on_pass()
            if self.guard.call(HEALTH, self.unfit_nodes, launch, default=()):
                return WatchResult("health", detections=tuple(pending))
            lost = self.observe_nodes(launch)
            if lost:
                return WatchResult("detection", detections=tuple(pending + held + lost))
            faults: list[DetectionEvent] = []  # every fault of this pass: all agents silent is one finding
            for d in self.guard.call(DETECT, self.observe, launch, default=[]):
                if not d.is_fault:
                    self.record(ev.detection_event(d, self.clock()))
                    if self.on_warning is not None:
                        self.on_warning(d)
                elif d.kind == RANK_EXITED:
                    # Ranks finish one by one; srun (--kill-on-bad-exit) ends the step at once on a crash.
                    # Only a rank gone while srun keeps running past the grace time is a fault by itself.
                    pending.append(d)
                    exited_since = exited_since or now
                elif d.kind in HANG_KINDS and self.nodeloss is not None and self.nodeloss.undecided:
                    # A hang needs a live agent saying the process is there; while some node is quiet and not
                    # yet judged, its loss (peers stuck in a collective) would be misread as a hang.
                    held.append(d)
                else:
                    faults.append(d)
            if faults:
                return WatchResult("detection", detections=tuple(pending + held + faults))
            if held and not (self.nodeloss is not None and self.nodeloss.undecided):
                return WatchResult("detection", detections=tuple(pending + held))
            if pending and launch.worker_restarts:  # torchrun restarted them: new processes under the same ranks
                pending = back_again(pending, self.live(launch).ranks)
                exited_since = exited_since if any(d.kind == RANK_EXITED for d in pending) else None
            if exited_since is not None and now - exited_since > self.exit_grace(launch, pending) \
                    and (now - exited_since > ALL_EXITED_GRACE_S or not self.all_ranks_ended(launch)):  # fmt: skip
                return WatchResult("detection", detections=tuple(pending + self.verdict_on_silent_nodes(launch)))
            if self.agents.died():
                self.guard.call(AGENTS, self.agents.restart, default=None)

    def unfit_nodes(self, launch: Launch) -> tuple[str, ...]:
        """Nodes of the launch with a fatal health finding (the reports that arrived are journaled first)."""
        if self.health is None:
            return ()
        self.health.update(self.channel.table)
        return tuple(self.health.faults(launch.nodes))

    def observe_nodes(self, launch: Launch) -> list[DetectionEvent]:
        """Our own node-loss verdicts; a lost node of this launch ends the watch (a lost spare is journaled and
        left out of later launches, but interrupts nothing)."""
        if self.nodeloss is None:
            return []
        live = self.channel.table.snapshot()
        found = self.guard.call(DETECT, self.nodeloss.observe, live.ranks, default=[])
        return [d for d in found if set(d.nodes) & set(launch.nodes)]

    def all_ranks_ended(self, launch: Launch) -> bool:
        ranks = self.live(launch).ranks
        return bool(ranks) and all(r.state in procstate.ENDED for r in ranks)

    def exit_grace(self, launch: Launch, pending: list[DetectionEvent]) -> float:
        """How long srun may outlive exited ranks: EXIT_GRACE_S after a crash; after normal exits (code 0 or
        atexit ran) the peers are finishing too and get the detector's finish allowance."""
        if launch.worker_restarts:  # torchrun stops the group's other workers and rendezvous again first
            return ALL_EXITED_GRACE_S
        exited = {r for d in pending if d.kind == RANK_EXITED for r in d.ranks}
        views = [r for r in self.live(launch).ranks if r.rank in exited]
        if views and len({r.rank for r in views}) == len(exited) and all(map(finished_normally, views)):
            return max(EXIT_GRACE_S, self.detector.config.hang.finish_allowance_s)
        return EXIT_GRACE_S

    def verdict_on_silent_nodes(self, launch: Launch) -> list[DetectionEvent]:
        """A crash seen from the survivors (gloo errors, exits) often means a node died: until every node of
        the launch has spoken since the end (an agent reports at once when its ranks exit), or our verdict on
        the quiet ones is in, wait, so the dead node, not the network, takes the blame."""
        if self.nodeloss is not None:
            return self._await_node_verdicts(launch)
        hang = self.detector.config.hang
        deadline = time.monotonic() + hang.node_silence_s + 1.0
        found: list[DetectionEvent] = []
        while time.monotonic() < deadline:
            found += [d for d in self.guard.call(DETECT, self.observe, launch, default=[]) if d.is_fault]
            views = self.channel.table.node_views()
            stale = [n for n in launch.nodes if n not in views or views[n].staleness_s > hang.node_stale_s]
            if not stale or any(d.kind == NODE_SILENT for d in found):
                break
            self.settle(0.5)
        return found

    def _await_node_verdicts(self, launch: Launch) -> list[DetectionEvent]:
        assert self.nodeloss is not None
        judge = self.nodeloss.judge
        since = time.monotonic() - EXIT_SETTLE_S
        deadline = time.monotonic() + judge.timeout_s + judge.config.probe_timeout_s + 1.0
        found: list[DetectionEvent] = []
        while time.monotonic() < deadline:
            found += [d for d in self.guard.call(DETECT, self.observe, launch, default=[]) if d.is_fault]
            found += self.observe_nodes(launch)
            if any(d.kind == NODE_LOST for d in found):
                break
            views = self.channel.table.node_views()
            quiet_since = time.monotonic() - since
            waiting = [n for n in launch.nodes if n in views and n not in self.nodeloss.lost
                       and views[n].staleness_s >= quiet_since]  # fmt: skip
            if not waiting and not self.nodeloss.undecided:
                break
            self.settle(0.2)
        return found

    def scan_checkpoints(self) -> None:
        self.guard.call(CHECKPOINT_SCAN, self.checkpoints.scan, default=None)

    def journal_timeouts(self) -> None:
        learned = self.detector.timeouts.to_dict()
        if learned:
            self.record(ev.timeouts_learned(self.clock(), learned, self.detector.timeouts.learned()))

    def settle(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.channel.poll(0.05)

    def live(self, launch: Launch) -> Any:
        """The heartbeat table's snapshot of the launch's nodes, without the ranks of earlier launches."""
        live = self.channel.table.snapshot()
        nodes = set(launch.nodes)
        return dataclasses.replace(
            live, nodes={n: v for n, v in live.nodes.items() if n in nodes},
            ranks=[r for r in live.ranks if r.pid not in self.old_pids and r.node in nodes],
        )  # fmt: skip

    def observe(self, launch: Launch) -> list[DetectionEvent]:
        live = self.live(launch)
        if self.on_live is not None:
            self.on_live(live)
        finite = [r.loss_step for r in live.ranks if r.loss is not None and math.isfinite(r.loss)]
        if finite:  # the newest iteration known to have a finite loss: later checkpoints are suspect after a NaN
            self.checkpoints.saw_finite_loss(max(finite))
        snap = snapshot_from_live(live, launch_age_s=time.monotonic() - launch.started)
        return self.detector.observe(snap, self.clock())

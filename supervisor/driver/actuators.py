"""Carrying out the policy's actions, one small actuator per action kind, dispatched through a table.

The loop decides *when* to ask, ``classify``/``policy`` decide *what*, and the actuators know *how*: through the
heartbeat channel (checkpoint/stop flags, stack dumps), the Slurm client (kill a job step, drain, requeue,
exclude) and the alert hooks. Dependencies are injected, so the unit tests drive them with in-process fakes.
Every action is journaled before it is carried out.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from slurm.client import SlurmClient
from slurm.errors import SlurmError
from supervisor import alerts, procstate
from supervisor.agent.stacks import MAX_DUMP_S
from supervisor.client.layout import FLAG_CHECKPOINT, FLAG_STOP
from supervisor.config import AlertConfig
from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions.respond import last_step
from supervisor.driver import launcher
from supervisor.driver.checkpoint_request import CheckpointRequest
from supervisor.driver.context import Context
from supervisor.driver.guard import ACTION, CHECKPOINT_SCAN
from supervisor.driver.launcher import Launch
from supervisor.driver.memory_flush import MemoryFlush, Pending
from supervisor.driver.memory_persist import MemoryPersist
from supervisor.driver.ports import Channel
from supervisor.driver.requeue import JobActions
from supervisor.driver.signals import SignalInbox
from supervisor.heartbeat import wire

log = structlog.get_logger("supervisor")

# Exit codes of `supervise run` (the batch step): what Slurm records as the job's exit code.
EXIT_COMPLETED = 0
EXIT_STOPPED = 1
EXIT_REQUEUED = 0  # the job is requeued; this run ends cleanly

KILL_WAIT_S = 15.0  # after scancel of a step, how long srun gets to exit before it is killed
KILL_RANKS_WAIT_S = 5.0  # after the agents were told to kill hung ranks, how long until they are seen gone
NODE_LOST_KILL_WAIT_S = 0.2  # srun waits forever for the tasks of a dead node: kill it (nearly) at once
SLURM_TERM_WAIT_S = 30.0  # when Slurm is ending the job, how long its own SIGTERM/SIGKILL may take
STACKS_WAIT_S = MAX_DUMP_S + 2.0  # the agents' longest dump (py-spy --native, then --nonblocking) + transit
FLUSH_AFTER_END_S = 10.0  # after the launch ended, how long the memory flush's copies may still take
TIME_LIMIT_MARGIN_S = 10.0  # at a time limit, the save is waited for until this long before Slurm's EndTime

RELAUNCH = -1  # an actuator's answer: end the action list, relaunch in this allocation


@dataclass(frozen=True)
class Situation:
    """What the actions of one decision act on: the launch, and why it ended (or must end)."""

    launch: Launch
    interruption: cl.Interruption
    decision: policy.Decision
    evidence: cl.Evidence
    history: policy.History | None = None  # the campaign before this interruption (the alert's streak)


Actuator = Callable[[policy.Action, Situation], "int | None"]


class Actuators:
    """``carry_out`` runs a decision's actions in order; each kind has one method, found through ``table``.

    An actuator returns None to go on with the next action, :data:`RELAUNCH`, or the exit code of this run."""

    def __init__(
        self, ctx: Context, *, slurm: SlurmClient, channel: Channel, inbox: SignalInbox, jobs: JobActions,
        job_id: str, campaign: str, alerts_config: AlertConfig, checkpoint_grace_s: float,
        ranks_of: Callable[[Launch], Sequence[Any]], checkpoints: Any = None,
        submit_alert: Callable[[alerts.Alert | None], None] | None = None, budgets: Any = None,
        memory_flush: MemoryFlush | None = None, tasks_per_node: int = 1, memory_persist: MemoryPersist | None = None,
    ) -> None:  # fmt: skip
        """``ranks_of(launch)``: the launch's rank views (``Watcher.ranks``); ``checkpoints``: the
        ``CheckpointTracker`` (was the requested save committed?); ``submit_alert``: the alert dispatcher (off the
        loop's path)."""
        self.record, self.clock, self.guard = ctx.record, ctx.clock, ctx.guard
        self.slurm, self.channel, self.inbox, self.jobs = slurm, channel, inbox, jobs
        self.job_id, self.campaign = job_id, campaign
        self.alerts_config, self.checkpoint_grace_s, self.ranks_of = alerts_config, checkpoint_grace_s, ranks_of
        self.checkpoints = checkpoints
        self.submit_alert, self.budgets = submit_alert, budgets
        self.memory_flush, self.tasks_per_node, self.memory_persist = memory_flush, tasks_per_node, memory_persist
        self.table: dict[str, Actuator] = {
            policy.ALERT: self.alert,
            policy.CHECKPOINT_NOW: self.stop_step,
            policy.STOP_STEP: self.stop_step,
            policy.FLUSH_MEMORY: self.flush_memory,
            policy.DUMP_STACKS: self.dump_stacks,
            policy.KILL_STEP: self.kill_step,
            policy.KILL_RANKS: self.kill_ranks,
            policy.MARK_SUSPECT: self.mark_suspect,
            policy.DRAIN: self.drain,
            policy.BACKOFF: self.backoff,
            policy.RESTART_IN_ALLOCATION: self.restart_in_allocation,
            policy.WARM_RESTART: self.warm_restart,
            policy.REQUEUE: self.requeue,
            policy.HOLD: self.requeue,
            policy.AWAIT_REQUEUE: self.await_requeue,
            policy.STOP: self.stop,
            policy.FINISH: self.stop,
        }

    def carry_out(self, situation: Situation) -> int | None:
        """Execute the policy's actions in order; the exit code when this run is over, None to relaunch."""
        for action in situation.decision.actions:
            self.record(action.to_event(self.clock()))
            actuator = self.table.get(action.kind)
            if actuator is None:
                log.warning("action_unknown", kind=action.kind)
                continue
            # A failing actuator is journaled and the next action runs: a dead webhook must not cost the requeue.
            result = self.guard.call(f"{ACTION}:{action.kind}", actuator, action, situation, default=None)
            if result == RELAUNCH:
                return None
            if result is not None:
                return result
        self.guard.call(f"{ACTION}:end_launch", self.end_launch, situation.launch, default=None)
        return None

    # ------------------------------------------------------------------------------------ the launch's ranks
    def alert(self, action: policy.Action, s: Situation) -> int | None:
        if action.tier in (None, "L1"):
            return None
        detections: list[Mapping[str, Any]] = [d.to_dict() for _, d in s.evidence.detections]
        detections += s.evidence.health_findings  # a failed health check: its figures
        if self.submit_alert is None:  # (no dispatcher injected: deliver here, bounded by the sinks' timeouts)
            alerts.send(self.alerts_config, alerts.document(self.job_id, self.campaign,
                                                            action.to_event(self.clock()), detections))
            return None
        decision = policy.Decision((action,), s.decision.state, s.decision.message)
        self.submit_alert(alerts.for_decision(
            self.job_id, self.campaign, decision, s.interruption, detections, history=s.history,
            budgets=self.budgets, ran_s=time.monotonic() - s.launch.started, t=self.clock(),
        ))  # fmt: skip
        return None

    def stop_step(self, action: policy.Action, s: Situation) -> int | None:
        """L3: ask every rank to (checkpoint and) stop; the job step is killed if it has not exited in time."""
        checkpoint = action.kind == policy.CHECKPOINT_NOW or bool(action.params.get("checkpoint", True))
        grace_s = float(action.params.get("grace_s", self.checkpoint_grace_s))
        launch = s.launch
        if launch.proc.poll() is not None:
            return None
        if not checkpoint:
            # Stop without a checkpoint (a NaN state must not overwrite good ones): the ranks get no chance to
            # save, as SIGTERM would give them.
            launcher.kill_step(self.slurm, self.job_id, launch.names, launch.proc)
            return None
        # Each rank gets the request once it shows up (ranks starting after Slurm's USR1 included), again if
        # its flags do not show it; then the save is awaited: the launch ends once every rank saved and stopped.
        request = CheckpointRequest(self.channel, lambda: self.ranks_of(launch),
                                    FLAG_CHECKPOINT | FLAG_STOP)  # fmt: skip
        before = self.checkpoints.best_step if self.checkpoints is not None else None
        self.record(ev.checkpoint_requested(self.clock(), "checkpoint and stop"))
        started = time.monotonic()
        deadline = started + grace_s
        end = s.evidence.scheduled_end
        if s.interruption.cls == ev.TIMEOUT and end is not None:  # leave time to requeue before the limit
            deadline = min(deadline, started + max(1.0, end - self.clock() - TIME_LIMIT_MARGIN_S))
        # Meanwhile the node agents copy the newest memory snapshot to the filesystem, in case the ranks' save
        # does not come (ranks that ignore the request, a save slower than the grace): see driver/memory_flush.py.
        flush = self._start_flush(launch, before)
        while launch.proc.poll() is None and time.monotonic() < deadline:
            request.deliver()
            self.channel.poll(0.2)
        self.check_saved(before, request, time.monotonic() - started, launch.proc.poll() is None)
        self._finish_flush(flush, deadline)
        return None

    def flush_memory(self, action: policy.Action, s: Situation) -> int | None:
        """The ranks ended before they could save (Slurm signals every step at once when it preempts without a
        user signal), or a fault makes the job let go of its nodes (a requeue, a stop): the node agents, which
        stay for it, copy the newest memory snapshot to the filesystem, asking no node in ``params.exclude`` (a
        lost node's shards come from its buddy). A launch still running (a hang) is ended first: its ranks must
        not replace the snapshot being copied."""
        if s.launch.proc.poll() is None:
            self.end_launch(s.launch, wait_s=self._kill_wait(s))
        if self.checkpoints is not None:
            self.guard.call(CHECKPOINT_SCAN, self.checkpoints.scan, default=None)
        before = self.checkpoints.best_step if self.checkpoints is not None else None
        deadline = time.monotonic() + FLUSH_AFTER_END_S
        end = s.evidence.scheduled_end
        if end is not None:  # Slurm's SIGKILL comes at the end of the grace time or the time limit
            deadline = min(deadline, time.monotonic() + max(1.0, end - self.clock() - 1.0))
        leave_out = {str(n) for n in action.params.get("exclude", ())}
        self._finish_flush(self._start_flush(s.launch, before, leave_out), deadline)
        return None

    def _start_flush(self, launch: Launch, newest_filesystem_step: int | None,
                     leave_out: Collection[str] = ()) -> Pending | None:  # fmt: skip
        if self.memory_flush is None:
            return None
        if self.memory_persist is not None:  # its copies would go into the same place: the stop's go alone
            self.memory_persist.cancel()
        usable = [n for n in launch.nodes if n not in leave_out]
        return self.guard.call(CHECKPOINT_SCAN, self.memory_flush.start, launch.nodes, self.tasks_per_node,
                               usable, newest_filesystem_step, default=None)  # fmt: skip

    def _finish_flush(self, flush: Pending | None, deadline: float) -> None:
        """Commit the flush unless the ranks saved a newer checkpoint themselves meanwhile."""
        if flush is None or self.memory_flush is None:
            return
        after = self.checkpoints.best_step if self.checkpoints is not None else None
        until = min(deadline, time.monotonic() + FLUSH_AFTER_END_S)  # dead agents must not hold up a requeue
        self.guard.call(CHECKPOINT_SCAN, self.memory_flush.finish, flush, after, until, default=None)

    def check_saved(self, before: int | None, request: CheckpointRequest, waited_s: float, running: bool) -> None:
        """Journal a requested checkpoint that did not commit (the next run resumes from an older one)."""
        if self.checkpoints is None or not self.checkpoints.checkpoint_dir:
            return  # where the program saves is unknown: nothing to check
        self.guard.call(CHECKPOINT_SCAN, self.checkpoints.scan, default=None)
        after = self.checkpoints.best_step
        if after is not None and (before is None or after > before):
            return
        why = ("the launch did not end within the wait" if running else "the launch ended") + \
            " without committing a new checkpoint"
        self.record(ev.checkpoint_missed(self.clock(), why, request.unreached(), round(waited_s, 1), after))

    def dump_stacks(self, action: policy.Action, s: Situation) -> int | None:
        """Save the stacks of every rank of the launch before it is killed: the hung ranks show where they are
        stuck, their peers show which collective they wait in. Each node's agent picks the way (the client's
        faulthandler for a live rank; py-spy --nonblocking for a stopped one, which stays stopped; py-spy
        --native for a rank without the client); the wait is bounded by the agents' own limits
        (``STACKS_WAIT_S``), and a rank whose agent did not answer in time is journaled without a stack."""
        asked: set[tuple[str, int]] = set()
        ranks = list(self.ranks_of(s.launch))
        for node in s.launch.nodes:
            here = [r.rank for r in ranks if r.node == node and r.state not in procstate.ENDED]
            if here:
                self.channel.send(node, [wire.Command(wire.CMD_DUMP_STACKS, r) for r in here])
                asked.update((node, r) for r in here)
        deadline = time.monotonic() + STACKS_WAIT_S
        events = self.channel.table.events
        while asked and time.monotonic() < deadline:
            self.channel.poll(0.1)
            while events:
                item = events.popleft()
                if item.get("event") in ("stacks_saved", "stacks_failed"):
                    asked.discard((item.get("node"), item.get("rank")))
                    self.record(ev.stacks(self.clock(), item.get("node"), item.get("rank"), item["event"],
                                          item.get("text")))  # fmt: skip
        for node, rank in sorted(asked):
            self.record(ev.stacks(self.clock(), node, rank, "stacks_failed",
                                  f"no answer from the node's agent within {STACKS_WAIT_S:g} s"))  # fmt: skip
        return None

    def kill_step(self, action: policy.Action, s: Situation) -> int | None:
        wait_s = self._kill_wait(s)
        launcher.kill_step(self.slurm, self.job_id, s.launch.names, s.launch.proc, wait_s=wait_s,
                           background=wait_s == NODE_LOST_KILL_WAIT_S)
        return None

    def kill_ranks(self, action: policy.Action, s: Situation) -> int | None:
        """Before a warm restart: the hung ranks alone are killed by their agents (the step keeps the others),
        then awaited gone (bounded: a rank that does not go makes the warm restart's choice cold)."""
        targets = {int(r) for r in action.target}
        deadline, next_send = time.monotonic() + KILL_RANKS_WAIT_S, 0.0
        while time.monotonic() < deadline:
            alive = [r for r in self.ranks_of(s.launch) if r.rank in targets and r.state not in procstate.ENDED]
            if not alive:
                break
            if time.monotonic() >= next_send:  # datagrams: sent again while the rank is still there
                for node in sorted({r.node for r in alive}):
                    self.channel.send(node, [wire.Command(wire.CMD_KILL_RANK, r.rank) for r in alive if r.node == node])
                next_send = time.monotonic() + 1.0
            self.channel.poll(0.1)
        return None

    def mark_suspect(self, action: policy.Action, s: Situation) -> int | None:
        """Nothing to do here: the ledger strikes the interruption's blamed nodes when it folds the journal."""
        return None

    def drain(self, action: policy.Action, s: Situation) -> int | None:
        try:
            self.slurm.drain(action.target, action.reason[:200] or "supervisor")
        except SlurmError as err:  # an actuator failing must not stop the response
            log.warning("action_failed", kind=action.kind, error=str(err))
        return None

    def backoff(self, action: policy.Action, s: Situation) -> int | None:
        self.inbox.wait(float(action.params.get("seconds", 0.0)))
        return None

    # ------------------------------------------------------------------------------------ what comes next
    def restart_in_allocation(self, action: policy.Action, s: Situation) -> int | None:
        self.end_launch(s.launch, wait_s=self._kill_wait(s))
        return RELAUNCH

    def warm_restart(self, action: policy.Action, s: Situation) -> int | None:
        """The launch restarts in its processes (the loop orders it: ``driver/warm_restart.py``): nothing ends."""
        return RELAUNCH

    def requeue(self, action: policy.Action, s: Situation) -> int | None:
        self.end_launch(s.launch, wait_s=self._kill_wait(s))
        self.record_attempt_end(s)
        i = s.interruption
        lost = i.blamed_nodes if i.cls == ev.NODE_FAILURE and action.kind == policy.REQUEUE else ()
        self.jobs.requeue(tuple(action.params.get("exclude", ())), hold=action.kind == policy.HOLD, lost=tuple(lost))
        if action.kind == policy.HOLD:
            self.held(s)
        return EXIT_REQUEUED

    def await_requeue(self, action: policy.Action, s: Situation) -> int | None:
        self.record_attempt_end(s)
        hold = bool(action.params.get("hold"))
        self.jobs.await_requeue(tuple(action.params.get("exclude", ())), hold=hold)
        if hold:
            self.held(s)
        return EXIT_REQUEUED

    def held(self, s: Situation) -> None:
        """The job waits for a person (``scontrol release``): the campaign says so, and why."""
        self.record(ev.campaign_ended(self.clock(), "held", s.decision.message))
        print(f"supervise: {s.decision.message}", file=sys.stderr, flush=True)

    def stop(self, action: policy.Action, s: Situation) -> int | None:
        # Journal first: when Slurm is ending the job, SIGKILL follows its SIGTERM after KillWait.
        self.record_attempt_end(s)
        finish = action.kind == policy.FINISH
        state = "completed" if finish else str(action.params.get("state", "stopped"))
        self.record(ev.campaign_ended(self.clock(), state, s.decision.message))
        self.end_launch(s.launch, slurm_is_ending=any(name == "TERM" for name, _ in s.evidence.batch_signals))
        print(f"supervise: {s.decision.message}", file=sys.stderr, flush=True)
        return EXIT_COMPLETED if finish else EXIT_STOPPED

    def record_attempt_end(self, s: Situation) -> None:
        i = s.interruption
        self.record(ev.attempt_ended(self.clock(), self.job_id, i.cls, i.blamed_nodes, i.evidence,
                                     last_step(s.evidence)))  # fmt: skip

    @staticmethod
    def _kill_wait(s: Situation) -> float:
        """After a node loss srun waits for the dead node's tasks forever and scancel for the dead node's answer:
        the step is scancelled in the background, and srun itself is killed after a short wait."""
        if s.interruption.cls == ev.NODE_FAILURE and s.interruption.blamed_nodes:
            return NODE_LOST_KILL_WAIT_S
        return KILL_WAIT_S

    def end_launch(self, launch: Launch, slurm_is_ending: bool = False, wait_s: float = KILL_WAIT_S) -> None:
        """Make sure the launch's job step is gone. When Slurm itself is ending the job (the batch step got
        SIGTERM: scancel, a requeue from outside), it signals the ranks too: let them finish (KillWait), never
        signal twice."""
        if slurm_is_ending:
            deadline = time.monotonic() + SLURM_TERM_WAIT_S
            while launch.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        if launch.proc.poll() is None:
            launcher.kill_step(self.slurm, self.job_id, launch.names, launch.proc, wait_s=wait_s,
                               background=wait_s == NODE_LOST_KILL_WAIT_S)

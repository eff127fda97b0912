"""Carrying out the policy's actions: alerts, checkpoint-and-stop, stack dumps, kills, requeues, exclusions.

A mixin of the supervisor loop (``supervisor.driver.loop.Supervisor``), split out so each file keeps one concern: the
loop decides *when* to ask, ``decide``/``policy`` decide *what*, and this module knows *how* with Slurm and the
node agents. Every action is journaled before it is carried out.
"""

from __future__ import annotations

import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import structlog

from supervisor import alerts, procstate
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions.ledger import Ledger
from supervisor.decisions.respond import StepEnding, job_state_of, last_step
from supervisor.driver import launcher
from supervisor.driver.launcher import Step
from supervisor.heartbeat import wire

log = structlog.get_logger("supervisor")

# Exit codes of `supervise run` (the batch step): what Slurm records as the job's exit code.
EXIT_COMPLETED = 0
EXIT_STOPPED = 1
EXIT_REQUEUED = 0  # the job is requeued; this run ends cleanly

SLURM_TERM_WAIT_S = 30.0  # when Slurm is ending the job, how long its own SIGTERM/SIGKILL may take


class Actuators:
    """Needs from the host class (the loop): the attributes and callables declared below."""

    server: Any
    slurm: Any
    job_id: str
    config: Any
    env: Any
    paths: Any
    layout: launcher.Layout
    inbox: Any
    history: list[dict[str, Any]]
    ledger_config: Any
    scheduled_end: float | None

    clock: Callable[[], float]
    record: Callable[[dict[str, Any]], None]
    _job: Callable[[], Any]
    _live: Callable[[Step], Any]

    def _carry_out(self, decision: policy.Decision, interruption: Any, step: Step, ending: StepEnding) -> int | None:
        """Execute the policy's actions in order; the exit code when this run is over, None to relaunch."""
        for action in decision.actions:
            self.record(action.to_event(self.clock()))
            kind = action.kind
            if kind == policy.ALERT:
                self._alert(action, ending)
            elif kind in (policy.CHECKPOINT_NOW, policy.STOP_STEP):
                checkpoint = kind == policy.CHECKPOINT_NOW or bool(action.params.get("checkpoint", True))
                grace = float(action.params.get("grace_s", self.config.run.checkpoint_grace_s))
                self._stop_step(step, checkpoint, grace)
            elif kind == policy.DUMP_STACKS:
                self._dump_stacks(step, ending)
            elif kind == policy.KILL_STEP:
                launcher.kill_step(self.slurm, self.job_id, step.name, step.proc)
            elif kind == policy.DRAIN:
                self._try(self.slurm.drain, action.target, action.reason[:200] or "supervisor")
            elif kind == policy.BACKOFF:
                self.inbox.wait(float(action.params.get("seconds", 0.0)))
            elif kind == policy.RESTART_IN_ALLOCATION:
                self._end_step(step)
                return None
            elif kind in (policy.REQUEUE, policy.HOLD):
                self._end_step(step)
                self._record_attempt_end(interruption, ending)
                exclude = tuple(action.params.get("exclude", ()))
                self._requeue(exclude, hold=kind == policy.HOLD)
                return EXIT_REQUEUED
            elif kind == policy.AWAIT_REQUEUE:
                self._record_attempt_end(interruption, ending)
                self._await_termination(step, tuple(action.params.get("exclude", ())))
                return EXIT_REQUEUED
            elif kind in (policy.STOP, policy.FINISH):
                # Journal first: when Slurm is ending the job, SIGKILL follows its SIGTERM after KillWait.
                self._record_attempt_end(interruption, ending)
                state = "completed" if kind == policy.FINISH else str(action.params.get("state", "stopped"))
                self.record(ev.campaign_ended(self.clock(), state, decision.message))
                self._end_step(step, ending)
                print(f"supervise: {decision.message}", file=sys.stderr, flush=True)
                return EXIT_COMPLETED if kind == policy.FINISH else EXIT_STOPPED
        self._end_step(step)
        return None

    def _ledger_exclusions(self) -> tuple[str, ...]:
        """Suspect nodes of the ledger that this allocation holds, left out when enough nodes remain."""
        suspects = Ledger.fold(self.history, self.ledger_config).excluded_nodes(self.clock())
        here = tuple(n for n in self.layout.nodes if n in suspects)
        return here if len(self.layout.nodes) - len(here) >= self.layout.train_nodes else ()

    def _next_exclusions(self, decision: policy.Decision) -> tuple[str, ...]:
        for action in decision.actions:
            if action.kind == policy.RESTART_IN_ALLOCATION:
                return tuple(action.params.get("exclude", ()))
        return ()

    def _record_attempt_end(self, interruption: Any, ending: StepEnding) -> None:
        self.record(ev.attempt_ended(self.clock(), self.job_id, interruption.cls, interruption.blamed_nodes,
                                     interruption.evidence, last_step(ending)))  # fmt: skip

    def _try(self, fn: Callable[..., object], *args: Any) -> None:
        try:
            fn(*args)
        except Exception as err:  # noqa: BLE001 - an actuator failing must not stop the response
            log.warning("action_failed", error=str(err))

    def _alert(self, action: policy.Action, ending: StepEnding) -> None:
        if action.tier in (None, "L1"):
            return
        doc = alerts.document(self.job_id, str(self.paths.root), action.to_event(self.clock()),
                              [d.to_dict() for d in ending.detections])  # fmt: skip
        alerts.send(self.config.alerts, doc)

    def _end_step(self, step: Step, ending: StepEnding | None = None) -> None:
        """Make sure the step is gone. When Slurm itself is ending the job (the batch step got SIGTERM: scancel,
        a requeue from outside), it signals the ranks too: let them finish (KillWait), never signal twice."""
        if ending is not None and "SIGTERM" in ending.signals:
            deadline = time.monotonic() + SLURM_TERM_WAIT_S
            while step.proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        if step.proc.poll() is None:
            launcher.kill_step(self.slurm, self.job_id, step.name, step.proc)

    def _dump_stacks(self, step: Step, ending: StepEnding, wait_s: float = 5.0) -> None:
        """Save the stacks of every rank of the step before it is killed: the hung ranks show where they are
        stuck, their peers show which collective they wait in. A stopped rank cannot run its dump handler, so
        it is recorded as such instead of being waited for."""
        assert self.server is not None
        wanted = 0
        for node in step.nodes:
            ranks = [r for r in self._live(step).ranks if r.node == node]
            stopped = [r.rank for r in ranks if r.state == procstate.STOPPED]
            for rank in stopped:
                self.record({"type": "stacks", "t": self.clock(), "node": node, "rank": rank,
                             "result": "stacks_failed", "detail": "the process is stopped (SIGSTOP/debugger)"})
            live = [r.rank for r in ranks if r.state != procstate.STOPPED and r.state not in procstate.ENDED]
            if live:
                self.server.send(node, [wire.Command(wire.CMD_DUMP_STACKS, r) for r in live])
                wanted += len(live)
        deadline = time.monotonic() + wait_s
        got = 0
        events = self.server.table.events
        while got < wanted and time.monotonic() < deadline:
            self.server.poll(0.1)
            while events:
                item = events.popleft()
                if item.get("event") in ("stacks_saved", "stacks_failed"):
                    got += 1
                    self.record({"type": "stacks", "t": self.clock(), "node": item.get("node"), "rank": item.get("rank"),
                                 "result": item.get("event"), "detail": item.get("text")})

    def _stop_step(self, step: Step, checkpoint: bool, grace_s: float) -> None:
        """L3: ask every rank to (checkpoint and) stop; the step is killed if it has not exited by ``grace_s``."""
        assert self.server is not None
        if step.proc.poll() is not None:
            return
        if checkpoint:
            flags = wire.flags_arg(slot_flag("FLAG_CHECKPOINT") | slot_flag("FLAG_STOP"), 0)
            for node in step.nodes:
                self.server.send(node, [wire.Command(wire.CMD_SET_FLAGS, wire.ALL_RANKS, flags)])
            self.record(ev.checkpoint_requested(self.clock(), "checkpoint and stop"))
        else:
            # Stop without a checkpoint (a NaN state must not overwrite good ones): the ranks get no chance to
            # save, as SIGTERM would give them.
            launcher.kill_step(self.slurm, self.job_id, step.name, step.proc)
            return
        deadline = time.monotonic() + grace_s
        while step.proc.poll() is None and time.monotonic() < deadline:
            self.server.poll(0.2)

    def _step_id(self, step: Step) -> str:
        return launcher.step_ids(self.slurm, self.job_id).get(step.name, f"{self.job_id}.0")

    def _requeue(self, exclude: tuple[str, ...], hold: bool = False) -> None:
        # Ignore the SIGTERM the requeue sends us until the exclusion is set (KillWait gives us the time).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        job = self._job()
        if job is not None and job_state_of(job, self.scheduled_end) == "CANCELLED":
            # Never undo a user's or an admin's scancel, whatever the classification said.
            self.record({"type": "requeue_skipped", "t": self.clock(), "reason": "the job was cancelled"})
            return
        if hold:
            self.slurm.requeue_hold(self.job_id)
        else:
            self.slurm.requeue(self.job_id)
        if exclude:
            self._exclude(exclude)

    def _await_termination(self, step: Step, exclude: tuple[str, ...] = (), limit_s: float = 300.0) -> None:
        """Slurm ends or requeues the job itself (preemption, node failure): let the ranks finish their
        checkpoint and wait for Slurm's signal, doing nothing that could tear a save. Once the requeue has
        begun (SIGTERM, job completing), the blamed nodes are excluded from the next run."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # KillWait is our time to set the exclusion
        self.inbox.drain()
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if self.server is not None:
                self.server.poll(1.0)
            job = self._job()
            requeued = job is None or job.is_completing or job.is_pending or job.restart_count > self.env.restart_count
            if requeued:
                if exclude:
                    self._exclude(exclude)
                return

    def _exclude(self, nodes: tuple[str, ...]) -> None:
        job = self._job()
        already = tuple(getattr(job, "excluded_nodes", ()) or ())
        # ExcNodeList is replaced, not extended: keep what the user or an earlier run excluded.
        wanted = sorted(set(already) | set(nodes))
        try:
            self.slurm.update_excluded_nodes(self.job_id, wanted)
        except Exception as err:  # noqa: BLE001 - the job still runs; the failed node is DOWN anyway
            log.warning("exclude_failed", nodes=wanted, error=str(err))
            return
        self.record({"type": "nodes_excluded", "t": self.clock(), "nodes": wanted})


def slot_flag(name: str) -> int:
    from supervisor.client import slot

    return int(getattr(slot, name))

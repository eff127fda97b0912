"""Watch one launch until it exits, a detector finds a fault, or something outside the training ends it.

Each pass feeds the pure detectors with the heartbeat table's snapshot of the launch's ranks (ranks of earlier
launches left out), hands their findings to the pure triage (``decisions/triage.py``: warnings, pending exits,
hangs held for a node-loss verdict, faults) and journals the warnings as they come. Side duties of a running
launch: new valid checkpoints (the campaign's progress), learned timeouts, the agents' step, the health reports,
our own node-loss verdicts, and the observers of each pass (goodput records, the checkpoint interval, metrics).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

from supervisor import procstate
from supervisor.client.layout import (
    RANK_FLAG_ENDED_CLEAN,
    RANK_FLAG_EXITING,
    RANK_FLAG_RETURNED,
)
from supervisor.decisions import events as ev
from supervisor.decisions import warm_restart as warm_rule
from supervisor.decisions.detect import (
    GLOBAL_STALL,
    NODE_LOST,
    NODE_SILENT,
    RANK_EXITED,
    RANK_HANG,
    DetectionEvent,
    Detector,
    snapshot_from_live,
)
from supervisor.decisions.detect.findings import of_silence
from supervisor.decisions.triage import Triage
from supervisor.driver.agents import AgentStep
from supervisor.driver.checkpoint_tracker import CheckpointTracker
from supervisor.driver.context import Context
from supervisor.driver.evidence import WatchResult
from supervisor.driver.guard import ACTION, AGENTS, CHECKPOINT_SCAN, DETECT, EVIDENCE, HEALTH
from supervisor.driver.health_watch import HealthWatch
from supervisor.driver.interrupts import Interrupts
from supervisor.driver.launcher import Launch
from supervisor.driver.nodeloss import NodeLossWatch
from supervisor.driver.notify import Notifier
from supervisor.driver.ports import Channel
from supervisor.driver.rank_kill import kill_ranks
from supervisor.driver.stall_probe import StallProbe
from supervisor.driver.standbys import Standbys
from supervisor.driver.straggler_swap import SwapJudge

CHECKPOINT_SCAN_S = 5.0  # how often the checkpoint directory is looked at for new valid checkpoints
TIMEOUTS_JOURNAL_S = 600.0  # learned timeouts are journaled this often (and whenever a launch ends)
EXIT_SETTLE_S = 0.6  # after srun exits: time for the agents to report how each rank ended
LINGER_S = 3.0  # after a warm restart: every rank ended well this long ago, the step still runs -> the launch ended


class Observer(Protocol):
    """Sees the launch's ranks each pass (``live``: the table's snapshot of the launch)."""

    def observe(self, live: Any) -> None: ...


class Watcher:
    def __init__(
        self, ctx: Context, *, channel: Channel, detector: Detector, checkpoints: CheckpointTracker,
        agents: AgentStep, interrupts: Interrupts, loop_interval_s: float, notifier: Notifier | None = None,
        observers: Sequence[Observer] = (), health: HealthWatch | None = None, nodeloss: NodeLossWatch | None = None,
        stall: StallProbe | None = None, swap: SwapJudge | None = None, standbys: Standbys | None = None,
    ) -> None:  # fmt: skip
        self.ctx, self.channel, self.detector, self.checkpoints = ctx, channel, detector, checkpoints
        self.agents, self.interrupts, self.loop_interval_s = agents, interrupts, loop_interval_s
        self.notifier, self.observers = notifier, tuple(observers)  # warnings and metrics; goodput, the interval
        self.health = health  # the agents' health reports: a node of the launch found unfit ends the watch
        self.nodeloss = nodeloss  # our own verdict on silent nodes; it takes precedence over hangs
        self.old_pids: set[int] = set()  # rank pids of earlier launches: their slots linger until overwritten
        self.stall = stall  # names the rank a stall waits for from the stacks of ranks past their own timeout
        self.held: tuple[DetectionEvent, ...] | None = None  # a global stall held while the stall probe reads stacks
        self.swap = swap  # whether a straggler warning is worth swapping its node for a spare now
        self.stuck_since: float | None = None  # a warm launch: since when some ranks wait while others are stuck
        self.released: set[int] = set()  # ranks killed because they held their peers back (once per watch)
        self.standbys = standbys  # a warm launch's pre-started processes, topped up while it trains

    def forget_ranks(self) -> None:
        """Called before a new launch: the ranks now in the table belong to earlier launches."""
        self.old_pids.update(r.pid for r in self.channel.table.snapshot().ranks)

    def watch(self, launch: Launch) -> WatchResult:
        next_eval = next_scan = next_timeouts = 0.0
        triage = Triage(launch.worker_restarts, self.detector.config.hang.finish_allowance_s)
        self.held = None
        self.stuck_since, self.released = None, set()
        self.ended_well_since: float | None = None
        if self.stall is not None:
            self.stall.reset()
        self.interrupts.watching()
        while True:
            self.channel.poll(0.1)
            interrupt = self.interrupts.check()
            if interrupt is not None:
                return WatchResult(interrupt.reason, detections=triage.with_pending(), signals=interrupt.signals,
                                   time_limit_near=interrupt.time_limit_near)  # fmt: skip
            code = launch.proc.poll()
            if code is not None:
                self.settle(EXIT_SETTLE_S)
                code = self.generation_code(launch, code)
                self.scan_checkpoints()
                found = self.verdict_on_silent_nodes(launch) if code != 0 else []
                return WatchResult("exited", exit_code=code, detections=triage.with_pending(found))
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + CHECKPOINT_SCAN_S
                self.scan_checkpoints()
            if now >= next_timeouts:
                if next_timeouts:
                    self.ctx.guard.call(DETECT, self.journal_timeouts, default=None)
                next_timeouts = now + TIMEOUTS_JOURNAL_S
            if now < next_eval:
                continue
            next_eval = now + self.loop_interval_s
            self.ctx.guard.call(EVIDENCE, launch.reader.advance, default=0)  # the log's new lines (first errors)
            ending = self.one_pass(launch, triage, now)
            if ending is not None:
                return ending
            if launch.warm:
                if launch.startup_s is None and not launch.generation and any(r.beats > 0 for r in self.ranks(launch)):
                    launch.startup_s = now - launch.started  # (a first step means every rank passed the rendezvous)
                if self.lingers(launch, now):  # the training is over; what still runs of the step waits on nothing
                    self.scan_checkpoints()
                    return WatchResult("exited", exit_code=0, detections=triage.with_pending())
                if self.standbys is not None:
                    self.ctx.guard.call(ACTION + ":standbys", self.standbys.keep, launch, default=None)
                views = self.warm_views(launch)
                if warm_rule.survivors_wait(views):
                    return WatchResult("detection", detections=triage.with_pending())
                hung = self.release_held_back(launch, views, now)
                if hung is not None:  # its peers' collectives timed out on it: a hang, its rank named
                    return WatchResult("detection", detections=triage.with_pending((hung,)))
            failed = self.replacement_failed(launch) or self.replacement_missing(launch, now)
            if failed is not None:  # its peers wait for it in the rendezvous: nothing else would end this
                return WatchResult("detection", detections=triage.with_pending((failed,)))
            if self.agents.died():
                self.ctx.guard.call(AGENTS, self.agents.restart, default=None)

    def one_pass(self, launch: Launch, triage: Triage, now: float) -> WatchResult | None:
        """One evaluation of the launch: health, node loss, detectors, pending exits. A result ends the watch."""
        if self.notifier is not None:
            self.notifier.update_metrics(self.channel)
        if self.ctx.guard.call(HEALTH, self.unfit_nodes, launch, default=()):
            return WatchResult("health", detections=triage.with_pending())
        lost = self.observe_nodes(launch)
        if lost:
            return WatchResult("detection", detections=(*triage.pending, *triage.held, *lost))
        found = self.ctx.guard.call(DETECT, self.observe, launch, default=[])
        undecided = self.nodeloss is not None and self.nodeloss.undecided
        verdict = triage.sort(found, now, undecided)
        for d in verdict.warnings:
            judged = self.ctx.guard.call(DETECT, self.judge_swap, d, launch, default=None)
            if judged is not None:
                d = dataclasses.replace(d, evidence=(*d.evidence, judged.why))
            if judged is not None and judged.swap:  # journaled as the launch's ending (Gatherer.gather); its L3
                return WatchResult("swap", detections=(*triage.pending, d), swap=judged)  # alert, strike: the swap's
            self.ctx.record(ev.detection_event(d, self.ctx.clock()))
            if self.notifier is not None:
                self.notifier.warning(d)
        named = self.ctx.guard.call(DETECT, self.probe_stall, launch, default=None)
        if named is not None:  # the rank the others wait for, within its own phase's timeout
            return WatchResult("detection", detections=(named,))
        if verdict.ending is not None:
            if self.stall is not None and self.stall.pending and all(d.kind == GLOBAL_STALL for d in verdict.ending):
                self.held = verdict.ending  # everyone silent on one step: the stacks may name the one they wait for
                return None
            return WatchResult("detection", detections=verdict.ending)
        if self.held is not None and not (self.stall is not None and self.stall.pending):
            return WatchResult("detection", detections=self.held)
        if triage.exits_overdue(now, self.live(launch).ranks):
            return WatchResult("detection", detections=triage.with_pending(self.verdict_on_silent_nodes(launch)))
        return None

    def warm_views(self, launch: Launch) -> list[warm_rule.RankView]:
        return warm_rule.views_of(self.ranks(launch))

    def release_held_back(self, launch: Launch, views: list[warm_rule.RankView], now: float) -> DetectionEvent | None:
        """Ranks waiting for their order after their own error while their peers stay stuck
        (``warm_rule.holding_back``): killed by their agents, once, so the peers' collectives fail; the warm
        restart then starts them again. Ranks stuck while every waiting one failed on a peer
        (``warm_rule.hung_by_peers``): a ``rank_hang`` naming them, returned to end the watch."""
        stuck = any(v.awaiting for v in views) and any(v.alive and not v.awaiting for v in views)
        self.stuck_since = (self.stuck_since or now) if stuck else None
        stuck_s = now - self.stuck_since if self.stuck_since is not None else 0.0
        hung = warm_rule.hung_by_peers(views, stuck_s)
        if hung:
            waiting = ", ".join(str(v.rank) for v in views if v.awaiting)
            return of_silence(RANK_HANG, hung, (v.node for v in views if v.rank in hung), "stuck_s", stuck_s,
                              warm_rule.HOLD_BACK_GRACE_S,
                              f"rank {', '.join(map(str, hung))} neither steps nor waits for a restart order while "
                              f"every waiting rank ({waiting}) saw its collective fail on a peer (the backend's "
                              "timeout or a closed connection)")  # fmt: skip
        kill = warm_rule.holding_back(views, stuck_s)
        kill = tuple(r for r in kill if r not in self.released)
        if not kill:
            return None
        self.released.update(kill)
        kill_ranks(self.ctx, self.channel, views, kill, "waiting for the restart order while their peers stay in a "
                   "collective with them: their process's end closes the connections")  # fmt: skip
        return None

    def replacement_failed(self, launch: Launch) -> DetectionEvent | None:
        """A rank the last warm restart started again whose srun ended badly before the launch did (the node
        refused the step, the program died at start): a rank exit the agents may never have seen."""
        for rep in launch.replaced:
            code = rep.proc.poll() if rep.generation == launch.generation else None
            if code:
                return DetectionEvent(RANK_EXITED, ranks=(rep.rank,), nodes=(rep.node,), metric="exit_code",
                                      value=float(code), evidence=(f"rank {rep.rank} started again on {rep.node} "
                                                                   f"(step {rep.name}) ended with code {code}",))  # fmt: skip
        return None

    def replacement_missing(self, launch: Launch, now: float) -> DetectionEvent | None:
        """A rank the last warm restart started again that has not shown up in its slot within the deadline
        (``warm_rule.missing_replacements``): a hang of the restart, its rank named, no node blamed (a standby that
        could not take its assignment is nobody's node's fault); the restart under way then goes cold."""
        newest = [r for r in launch.replaced if r.generation == launch.generation]
        if not newest:
            return None
        deadline = warm_rule.show_up_deadline_s(launch.startup_s)
        shown = {r.rank for r in self.ranks(launch) if r.pid}
        missing = warm_rule.missing_replacements(((r.rank, r.started_at) for r in newest), shown, now, deadline)
        if not missing or deadline is None:
            return None
        where = {r.rank: r for r in newest}
        late = max(now - where[r].started_at for r in missing)
        return of_silence(RANK_HANG, missing, (), "show_up_s", late, deadline,
                          "; ".join(f"rank {r} started again on {where[r].node} ({where[r].name}) has not shown up in "
                                    f"its slot after {now - where[r].started_at:.0f} s (deadline {deadline:.0f} s: "
                                    "twice the launch's start-up, at least 60 s); the kept ranks wait for it in the "
                                    "rendezvous" for r in missing))  # fmt: skip

    def generation_code(self, launch: Launch, code: int) -> int:
        """srun's exit code, except after a warm restart: the training step's srun reports the death of the rank
        that was started again (``Killed``, 137) even when every rank of the last generation ended well; then 0."""
        if not code or not launch.generation:
            return code
        return 0 if self.generation_ended_well(launch) else code

    def lingers(self, launch: Launch, now: float) -> bool:
        """After a warm restart, whether every rank of the last generation ended well ``LINGER_S`` ago while the
        step still runs: under torchrun the torchruns of the kept ranks wait in their exit barrier (300 s) for the
        one that exited at the fault; the training is over."""
        if not launch.generation or not self.generation_ended_well(launch):
            self.ended_well_since = None
            return False
        self.ended_well_since = self.ended_well_since if self.ended_well_since is not None else now
        return now - self.ended_well_since >= LINGER_S

    def generation_ended_well(self, launch: Launch) -> bool:
        """Whether every rank of the launch's last generation ended with 0 (or as the client marks a normal end),
        and so did every rank started again in it."""
        ranks = self.ranks(launch)
        world = {r.rank for r in ranks}
        ended_well = RANK_FLAG_EXITING | RANK_FLAG_RETURNED  # an agent rarely learns the code of a process it did not start
        well = all(r.state in procstate.ENDED and (r.exit_code == 0 or (r.exit_code is None and r.exit_signal is None
                                                                        and r.rank_flags & ended_well)
                                                   or r.rank_flags & RANK_FLAG_ENDED_CLEAN
                                                   and bool(r.exit_signal))  # died in the teardown
                   for r in ranks)  # fmt: skip
        replacements_ok = all(rep.proc.poll() == 0 for rep in launch.replaced if rep.generation == launch.generation)
        return bool(ranks) and well and replacements_ok and len(world) == len(ranks)

    def judge_swap(self, detection: DetectionEvent, launch: Launch) -> Any:
        """The swap verdict on a straggler warning (None: another warning, or no judge)."""
        return None if self.swap is None else self.swap.judge(detection, self.live(launch), launch.nodes)

    def probe_stall(self, launch: Launch) -> DetectionEvent | None:
        """The stall probe's pass: the ranks past their own timeout (the hang detector's last observe) and the
        launch's live ranks, whose stacks it may ask for."""
        if self.stall is None:
            return None
        hang = getattr(self.detector, "hang", None)
        overdue = getattr(hang, "overdue", {})
        live = [(r.rank, r.node) for r in self.live(launch).ranks if r.state not in procstate.ENDED]
        return self.stall.update(overdue, live)

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
        found = self.ctx.guard.call(DETECT, self.nodeloss.observe, live.ranks, default=[])
        return [d for d in found if set(d.nodes) & set(launch.nodes)]

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
            found += [d for d in self.ctx.guard.call(DETECT, self.observe, launch, default=[]) if d.is_fault]
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
            found += [d for d in self.ctx.guard.call(DETECT, self.observe, launch, default=[]) if d.is_fault]
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
        self.ctx.guard.call(CHECKPOINT_SCAN, self.checkpoints.scan, default=None)

    def journal_timeouts(self) -> None:
        learned = self.detector.timeouts.to_dict()
        if learned:
            self.ctx.record(ev.timeouts_learned(self.ctx.clock(), learned, self.detector.timeouts.learned()))

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

    def ranks(self, launch: Launch) -> list[Any]:
        """The launch's rank views (what the actuators ask and stop, what the evidence reads)."""
        return list(self.live(launch).ranks)

    def observe(self, launch: Launch) -> list[DetectionEvent]:
        live = self.live(launch)
        for observer in self.observers:
            observer.observe(live)
        finite = [r.loss_step for r in live.ranks if r.loss is not None and math.isfinite(r.loss)]
        if finite:  # the newest iteration known to have a finite loss: later checkpoints are suspect after a NaN
            self.checkpoints.saw_finite_loss(max(finite))
        snap = snapshot_from_live(live, launch_age_s=time.monotonic() - launch.started)
        return self.detector.observe(snap, self.ctx.clock())

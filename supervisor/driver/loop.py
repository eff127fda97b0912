"""The supervision loop of one attempt (one Slurm run of the job): launch, watch, decide, act, until a decision
ends the attempt.

It is handed its parts whole by the composition root (``driver/compose.py``) and only strings them together:
the resume pick (``checkpoints``), the check before a launch (``prelaunch``), the launch (``trainer``), the watch
(``watcher``), the evidence of its ending (``gather``), the decision (the pure core: ``decisions.respond``, or a
user's stop request), the actions (``actuators``), and the placement of the next launch (``decisions.placement``).
The campaign's past is the campaign state the loop keeps (``decisions.campaign_state``, applied as each event is
journaled). Every decision is journaled before it is carried out.

Glossary (docs/architecture.md): attempt = one Slurm run; launch = one srun of the training inside it;
iteration = one training step counted by ``client.step(i)``; job step = Slurm's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from supervisor import stop_request
from supervisor.config import Config
from supervisor.decisions import campaign_state, capacity, placement, policy, rollback, straggler_swap
from supervisor.decisions import events as ev
from supervisor.decisions import warm_restart as warm_rule
from supervisor.decisions.classify import Evidence, Interruption
from supervisor.decisions.detect import LOSS_DIVERGED, NODE_SILENT, Detector
from supervisor.decisions.respond import last_step, respond
from supervisor.driver import flight_dumps, prelaunch
from supervisor.driver import warm_restart as warm_restarts
from supervisor.driver.actuators import Actuators, Situation
from supervisor.driver.agents import AgentStep
from supervisor.driver.checkpoint_tracker import CheckpointTracker
from supervisor.driver.context import Context
from supervisor.driver.env_now import EnvCheck
from supervisor.driver.evidence import Gatherer, WatchResult
from supervisor.driver.guard import (
    ACTION,
    CHECKPOINT_SCAN,
    DECIDE,
    DETECT,
    EVIDENCE,
    PREFLIGHT,
    SITE,
    SLURM_QUERY,
    GuardedChannel,
)
from supervisor.driver.health_watch import HealthWatch
from supervisor.driver.interval import IntervalAsker
from supervisor.driver.launcher import Launch, TrainingLauncher
from supervisor.driver.memory_resume import MemoryResume
from supervisor.driver.nodeloss import NodeLossWatch
from supervisor.driver.notify import Notifier
from supervisor.driver.preempt_watch import PreemptionPoller
from supervisor.driver.progress import ProgressLog
from supervisor.driver.requeue import JobActions
from supervisor.driver.site_link import SiteLink
from supervisor.driver.standbys import Standbys
from supervisor.driver.warm_restart import WarmRestarts
from supervisor.driver.watch import Watcher
from supervisor.paths import CampaignPaths

AGENTS_STOP_AFTER_LOSS_S = 0.5  # a lost node's agent never answers: its srun is ended after this (AgentStep.stop)


@dataclass(frozen=True)
class Parts:
    """The attempt's parts, built once (``compose.compose``)."""

    ctx: Context
    state: campaign_state.CampaignState  # the journal's fold, kept current by the recorder
    config: Config
    layout: placement.TrainingLayout
    paths: CampaignPaths
    job_id: str
    channel: GuardedChannel
    detector: Detector
    checkpoints: CheckpointTracker
    trainer: TrainingLauncher
    agents: AgentStep
    health: HealthWatch
    nodeloss: NodeLossWatch
    notifier: Notifier
    progress: ProgressLog
    interval: IntervalAsker
    preemption: PreemptionPoller
    watcher: Watcher
    prelaunch: prelaunch.Prelaunch
    gather: Gatherer
    actuators: Actuators
    jobs: JobActions  # the Slurm job itself (requeue, exclusions, its room in its partitions)
    env_check: EnvCheck  # the relaunch's environment against its checkpoint's
    memory: MemoryResume  # the memory tier's restore pick before a relaunch
    no_kill: bool  # the job keeps running when one of its nodes fails (``--no-kill``, set for spare nodes)
    site: SiteLink  # the site-wide node ledger (does nothing without ``[site] url``)
    warm: WarmRestarts  # whether a restart is carried out in the ranks' processes, and how
    standbys: Standbys  # pre-started processes beside a warm launch that take over its dead ranks

    def close(self) -> None:
        """End the attempt's side parts: pollers and probes, the agents' step (quickly after a node loss: its
        agent never answers), the channel, queued alerts (bounded) and the metrics endpoint."""
        self.preemption.close()
        self.nodeloss.close()
        self.ctx.guard.call("action:standbys", self.standbys.retire, default=None)
        self.agents.stop(wait_s=AGENTS_STOP_AFTER_LOSS_S if self.nodeloss.lost else 5.0)
        self.channel.close()
        self.notifier.close()


class Supervisor:
    def __init__(self, parts: Parts) -> None:
        self.p = parts
        self.rank_shift = 0  # ranks moved by this many nodes (placement.rank_shift_after)
        self.diverged_reached: int | None = None  # a roll back: the step the diverged launch reached
        self.again: Launch | None = None  # a launch restarted warm: watched again instead of a new launch

    def run(self) -> int:
        p = self.p
        p.preemption.start()
        p.channel.write_address_file()
        p.agents.spawn(p.layout.nodes)
        p.agents.wait_until_reported()
        p.ctx.guard.call(SITE, p.site.job_started, p.layout.nodes, default=None)
        try:
            return self.supervise()
        finally:
            p.ctx.guard.call(SITE, p.site.job_ended, p.layout.nodes, default=None)

    def supervise(self) -> int:
        """Launch, watch, decide, act; until a decision ends this attempt."""
        p = self.p
        excluded = placement.ledger_exclusions(p.layout, p.state.ledger.excluded_nodes(p.ctx.clock()))
        while True:
            excluded = self.with_site_exclusions(excluded)
            if self.again is not None:  # restarted warm: the same step, its ranks in a new generation
                launch, self.again = self.again, None
                watched, found = self.watch(launch)
            else:
                picked = p.ctx.guard.call(CHECKPOINT_SCAN, p.checkpoints.pick_resume, default=None)
                checked = p.ctx.guard.call(PREFLIGHT, p.prelaunch.check, p.layout.nodes, excluded,
                                           p.layout.train_nodes, p.trainer.launches + 1,
                                           default=prelaunch.Checked(excluded))  # fmt: skip
                if checked.enough:
                    excluded = checked.excluded
                    launch = self.launch(picked, excluded)
                    watched, found = self.watch(launch)
                else:  # too few nodes passed the preflight: the training does not start; the policy answers
                    launch = prelaunch.not_started(p.trainer.launches, p.trainer.log_dir / "preflight.log")
                    watched, found = WatchResult("preflight"), checked.evidence or Evidence()
            history = p.state.history  # the campaign before this interruption (History is immutable)
            request = stop_request.read(p.paths.root) if watched.reason == "stop_request" else None
            if request is not None:
                interruption, decision = stop_request.respond(request)
            elif watched.reason == "swap":  # a straggler worth a spare: checkpoint, stop, relaunch without it
                interruption, decision = straggler_swap.respond(watched.detections[-1], watched.swap, p.config.policy)
            else:
                interruption, decision = self.decide(launch, found, history)
            kill = None if request is not None else p.ctx.guard.call(
                DECIDE, p.warm.plan, launch, interruption, decision, watched.detections, default=None)  # fmt: skip
            if kill is not None:  # the same decision, carried out in the ranks' processes (only the hung killed)
                decision = warm_rule.as_warm(decision, kill)
            restarts = p.ctx.guard.call(EVIDENCE, launch.reader.torchrun_restarts, launch.nodes,
                                        p.layout.tasks_per_node, default={})  # fmt: skip
            interrupted_t = p.ctx.clock()
            p.ctx.record({**interruption.to_event(interrupted_t), "launch": launch.number,
                          "last_step": last_step(found), **({"torchrun_restarts": restarts} if restarts else {})})
            p.prelaunch.after(interruption.cls, interruption.blamed_nodes)  # a node it could have hurt: measured again
            p.ctx.guard.call(SITE, p.site.interrupted, interruption, default=None)
            outcome = p.actuators.carry_out(Situation(launch, interruption, decision, found, history))
            self.final_progress(launch)  # a checkpoint saved on the way out (preemption, time limit, cancel)
            if interruption.cls == ev.NUMERICAL:  # the launch is gone now: no checkpoint can appear after this
                normal = [int(d.value) for d in watched.detections if d.kind == LOSS_DIVERGED and d.value is not None]
                if normal:  # a loss that never came back from its spike: the weights went bad before it
                    p.checkpoints.diverged_from(min(normal))
                p.ctx.guard.call(CHECKPOINT_SCAN, p.checkpoints.quarantine_after_divergence, default=None)
                p.memory.diverged_after(p.trainer.launch_tag(launch.number), p.checkpoints.last_finite_loss_step)
            if kill is None or outcome is not None:  # the launch is over: its idle standbys go with it
                p.ctx.guard.call(ACTION + ":standbys", p.standbys.retire, default=None)
            if outcome is not None:
                if request is not None:
                    stop_request.clear(p.paths.root)
                return outcome
            if kill is not None:
                warm = p.ctx.guard.call(DECIDE, p.warm.choose, launch, interruption, default=None)
                released = p.ctx.clock() - interrupted_t  # every survivor let go and waits (or gave up)
                if warm is not None and warm.warm and p.ctx.guard.call(ACTION + ":warm_restart", self.restart_warm,
                                                                       launch, warm, released, default=False):  # fmt: skip
                    self.again = launch
                    excluded = tuple(sorted(set(excluded) | set(placement.exclusions_of(decision))))
                    continue
                p.ctx.guard.call(ACTION + ":standbys", p.standbys.retire, default=None)
                p.actuators.end_launch(launch)  # cold after all (journaled why): the step goes, a new launch
            excluded = placement.exclusions_of(decision)
            if any(d.kind == NODE_SILENT for d in watched.detections):  # the agents' silence is not the new launch's
                hang = p.detector.config.hang
                p.agents.wait_until_fresh(hang.node_stale_s, hang.node_silence_s)
            self.rank_shift += placement.rank_shift_after(interruption)
            if any(a.params.get("rollback") for a in decision.actions):
                self.diverged_reached = last_step(found)

    def watch(self, launch: Launch) -> tuple[WatchResult, Evidence]:
        """Watch ``launch`` until it ends or must end, and gather the evidence of why."""
        p = self.p
        watched = p.watcher.watch(launch)
        self.final_progress(launch)
        p.watcher.journal_timeouts()
        p.ctx.guard.call(DETECT, p.warm.saw, launch, default=None)
        found = p.ctx.guard.call(EVIDENCE, p.gather.gather, launch.nodes, launch.reader, watched,
                                 p.watcher.ranks(launch), flight_dumps.dump_dir(launch.log_path),
                                 default=None) or self.unknown_evidence(launch)  # fmt: skip
        return watched, found

    def restart_warm(self, launch: Launch, choice: warm_rule.WarmChoice, release_s: float = 0.0) -> bool:
        """Carry out a warm restart of ``launch`` (driver/warm_restart.py): resume where a relaunch would, journal
        it as the next launch (``step_launched`` with ``warm``), order the waiting ranks on, start the dead ones.
        ``release_s``: how long the survivors took to let go (journaled with the order's time once taken)."""
        p = self.p
        picked = p.ctx.guard.call(CHECKPOINT_SCAN, p.checkpoints.pick_resume, default=None)
        resume, resume_step = picked if picked is not None else (None, None)
        left = p.warm.move(launch)  # a lost or blamed node's ranks go to a spare; the others keep their nodes
        nodes = list(launch.nodes)
        usable = [n for n in placement.usable_nodes(p.layout, p.nodeloss.lost) if n not in left]
        where = p.warm.placement(launch)
        snapshot = p.ctx.guard.call(CHECKPOINT_SCAN, p.memory.pick, p.trainer.launches + 1, nodes,
                                    p.layout.tasks_per_node, usable, resume_step, True, where, default=None)  # fmt: skip
        memory_step = snapshot.step if snapshot is not None else None
        p.detector.new_launch()
        kept = [r for r in p.warm.ranks_of(launch) if r.pid]
        carried = {r.pid: r.beats for r in kept}  # their old steps are not progress
        p.progress.launched(p.trainer.launches + 1, carried, {r.pid: (getattr(r, "restore_ms", 0), getattr(r, "restores", 0)) for r in kept})
        p.interval.launched()
        p.checkpoints.launched(memory_step if memory_step is not None else resume_step)
        p.trainer.launches += 1
        launch.number = p.trainer.launches
        order = p.trainer.restart_order(launch, launch.generation + 1, resume, picked is not None, memory_step,
                                        snapshot.launch if snapshot else "", p.memory.flushed_dir(snapshot),
                                        p.warm.node_of(launch, 0))  # fmt: skip
        taken = p.ctx.guard.call(ACTION + ":standbys", p.warm.take_standbys, launch, choice, default=None) or {}
        told = order.env.get("SUPERVISOR_RESUME_FROM")
        tier = "memory" if memory_step is not None else "filesystem" if told else "fresh" if told == "" else "unknown"
        p.ctx.record({**ev.step_launched(p.ctx.clock(), launch.number, launch.nodes, left, resume),
                      "resume_step": memory_step if memory_step is not None else resume_step, "resume_tier": tier,
                      "master": f"{order.env.get('MASTER_ADDR', '')}:{order.env.get('MASTER_PORT', '')}",
                      "warm": True, "generation": order.generation, "replaced_ranks": list(choice.replace),
                      **({"standby_ranks": {str(r): s.ident for r, s in taken.items()}} if taken else {}),
                      "log": launch.log_path.name})  # its ranks go on writing the launch's log
        launch.log = launch.reader.from_now()  # the new generation's lines are judged alone
        ordered = p.ctx.clock()
        dead, untaken = p.warm.restart(launch, choice, order, taken)
        p.watcher.old_pids.update(dead)  # the replaced ranks' old processes are an earlier launch's
        if untaken:  # a rank that never takes its order would wedge the new generation: cold after all
            p.ctx.record(ev.warm_restart_skipped(
                p.ctx.clock(), launch.number, f"rank {', '.join(map(str, untaken))} did not take the restart order "
                f"within {warm_restarts.ORDER_TAKEN_WAIT_S:g} s"))  # fmt: skip
            return False
        now = p.ctx.clock()
        p.ctx.record(ev.warm_restart_ordered(now, launch.number, order.generation, release_s, now - ordered))
        return True

    def with_site_exclusions(self, excluded: tuple[str, ...]) -> tuple[str, ...]:
        """``excluded`` and the allocation's nodes the site ledger holds as bad, when enough nodes remain for the
        training without them (as for the campaign's own ledger); the site's failures never stop the loop."""
        p = self.p
        held = p.ctx.guard.call(SITE, p.site.excluded, p.layout.nodes, default=()) or ()
        extra = [n for n in held if n not in excluded and n not in p.nodeloss.lost]
        if not extra or len(p.layout.nodes) - len(set(excluded) | set(extra)) < p.layout.train_nodes:
            return excluded
        return tuple(sorted(set(excluded) | set(extra)))

    def launch(self, picked: tuple[str | None, int | None] | None, excluded: tuple[str, ...]) -> Launch:
        """The next launch, from ``picked``, the newest valid checkpoint (or a fresh start; None: unknown, the scan
        failed), on the usable nodes without ``excluded`` and the nodes found lost."""
        p = self.p
        resume, resume_step = picked if picked is not None else (None, None)
        p.detector.new_launch()  # the parts start the new launch afresh before its ranks can show up
        p.progress.launched(p.trainer.launches + 1)
        p.interval.launched()
        out = placement.without_doubtful(p.layout, set(excluded) | p.nodeloss.lost, p.nodeloss.doubtful)
        nodes = p.trainer.next_nodes(out, self.rank_shift)
        usable = [n for n in placement.usable_nodes(p.layout, p.nodeloss.lost) if n not in out]
        snapshot = p.ctx.guard.call(CHECKPOINT_SCAN, p.memory.pick, p.trainer.launches + 1, nodes,
                                    p.layout.tasks_per_node, usable, resume_step, default=None)  # fmt: skip
        memory_step = snapshot.step if snapshot is not None else None
        p.checkpoints.launched(memory_step if memory_step is not None else resume_step)
        p.watcher.forget_ranks()  # the ranks in the table now are earlier launches'
        skip = None
        if self.diverged_reached is not None:  # a roll back: skip the batches seen since the step it resumes at
            skip = rollback.skip_range(memory_step if memory_step is not None else resume_step, self.diverged_reached)
            self.diverged_reached = None
        launch = p.trainer.launch(resume, resume_step, out, self.rank_shift, scan_ok=picked is not None,
                                  memory_step=memory_step, memory_launch=snapshot.launch if snapshot else "",
                                  memory_from=p.memory.flushed_dir(snapshot), skip_steps=skip,
                                  warm=p.warm.next_launch_warm())  # fmt: skip
        # (its ranks start meanwhile: the check delays nothing)
        p.ctx.guard.call(CHECKPOINT_SCAN, p.env_check.resumed, resume, launch.nodes, p.trainer.known_ranks_per_node,
                         default=None)  # fmt: skip
        return launch

    def decide(self, launch: Launch, found: Evidence, history: policy.History) -> tuple[Interruption, policy.Decision]:
        """The core's decision on the evidence. Should it fail (a bug met by an odd piece of evidence: the
        program's text is among it), the failure is journaled and the decision is taken again on what is certain
        without that evidence: nobody is blamed, the policy's budget for unknown faults applies."""
        decided = self.p.ctx.guard.call(DECIDE, self.respond, launch, found, history, default=None)
        return decided if decided is not None else self.respond(launch, self.unknown_evidence(launch), history)

    def unknown_evidence(self, launch: Launch) -> Evidence:
        """What is certain when gathering or judging the evidence failed: the launch's nodes, nothing else."""
        return Evidence(allocation_nodes=launch.nodes, job_nodes=self.p.layout.nodes, unknown=("evidence",))

    def respond(self, launch: Launch, found: Evidence, history: policy.History) -> tuple[Interruption, policy.Decision]:
        p = self.p
        now = p.ctx.clock()
        interruption, decision = respond(
            found, history, p.state.ledger, nodes=placement.usable_nodes(p.layout, p.nodeloss.lost),
            needed=p.layout.train_nodes, config=p.config.policy, now=now,
            step_running=launch.proc.poll() is None, restarts_here=max(0, p.trainer.launches - 1),
            signatures=p.config.log_signatures, slurm_kills_on_node_failure=not p.no_kill,
            min_needed=p.config.run.min_nodes or None,
        )  # fmt: skip
        if not capacity.requeues(decision):
            return interruption, decision
        # A requeue that could never start (the exclusions leave its partitions too few nodes) is held instead.
        room = p.ctx.guard.call(SLURM_QUERY, p.jobs.room, len(p.layout.nodes), default=None)
        return interruption, capacity.fit_requeue(decision, room, **self.blame_notes(interruption, now))

    def blame_notes(self, interruption: Interruption, now: float) -> dict[str, Any]:
        """What :func:`capacity.fit_requeue` needs besides the room: the nodes that must stay out (the ledger's
        and this interruption's hard blame), why each node is out, and how a person lets one back in."""
        p = self.p
        out = p.state.ledger.excluded_nodes(now)
        blamed = frozenset(interruption.blamed_nodes)
        hard = out | (blamed if interruption.cls in policy.HARD_BLAME else frozenset())
        reasons = {row["node"]: f"struck: {row['last_reason'] or '?'}"
                   for row in p.state.ledger.table(now) if row["node"] in out}  # fmt: skip
        reasons.update({n: f"{interruption.cls} in this run" for n in blamed})
        hint = (f"forgive a repaired node with `supervise nodes {p.paths.root} --forgive NODE` (it also leaves the "
                f"job's ExcNodeList), then `scontrol release {p.job_id}`")  # fmt: skip
        return {"hard": hard, "reasons": reasons, "forgive_hint": hint}

    def final_progress(self, launch: Launch) -> None:
        p = self.p
        p.ctx.guard.call(DETECT, lambda: p.progress.observe(p.watcher.live(launch), final=True), default=None)


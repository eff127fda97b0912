"""``supervise run``: the supervisor of one attempt (one Slurm run of the job, inside its batch step).

It composes small parts with injected dependencies: the heartbeat channel and the node agents' job step
(``agents``), checkpoint tracking (``checkpoints``), the watch over one launch (``watch``), the evidence of an
ending (``evidence``), and the actuators (``actuators``, ``requeue``). The decisions are the pure core's:
detectors, ``classify``, ``policy`` (through ``decisions.respond``), and the campaign's past is the one fold
of the journal (``decisions.campaign_state``). Every decision is journaled before it is carried out.

Glossary (docs/architecture.md): attempt = one Slurm run; launch = one srun of the training inside it;
iteration = one training step counted by ``client.step(i)``; job step = Slurm's.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from slurm import probe, srun
from slurm.client import SlurmClient
from slurm.env import SlurmEnv
from slurm.errors import SlurmError
from slurm.probe import ProbeStarter
from supervisor import stop_request
from supervisor.campaign import CampaignSpec
from supervisor.config import Config
from supervisor.decisions import campaign_state, nodeloss, placement
from supervisor.decisions import events as ev
from supervisor.decisions.classify import Evidence
from supervisor.decisions.detect import NODE_SILENT, Detector
from supervisor.decisions.respond import last_step, respond
from supervisor.driver import distenv, evidence, health, launcher, prelaunch
from supervisor.driver.actuators import Actuators, Situation, slot_flag
from supervisor.driver.agents import AgentStep
from supervisor.driver.checkpoints import CheckpointTracker
from supervisor.driver.evidence import WatchResult, query_job, query_nodes
from supervisor.driver.guard import (
    CHECKPOINT_SCAN,
    DETECT,
    HEALTH,
    PREFLIGHT,
    SLURM_QUERY,
    Guard,
    GuardedChannel,
)
from supervisor.driver.health import HealthWatch
from supervisor.driver.interval import IntervalAsker
from supervisor.driver.launcher import Launch
from supervisor.driver.nodeloss import NodeLossWatch
from supervisor.driver.notify import Notifier
from supervisor.driver.ports import Channel, StepLauncher
from supervisor.driver.preempt_watch import PreemptionPoller
from supervisor.driver.progress import ProgressLog
from supervisor.driver.recorder import Recorder
from supervisor.driver.requeue import JobActions
from supervisor.driver.signals import SignalInbox
from supervisor.driver.time_limit_watch import TimeLimitClock
from supervisor.driver.watch import Watcher
from supervisor.heartbeat.server import BIND_ENV, bind_address, resolve_sources
from supervisor.journal import Journal, read
from supervisor.paths import SLOT_DIR_ENV, CampaignPaths, slot_dir_template

ChannelFactory = Callable[[Path, str, tuple[str, int], "frozenset[str] | None"], Channel]
AGENTS_STOP_AFTER_LOSS_S = 0.5  # a lost node's agent never answers: its srun is ended after this (AgentStep.stop)


def aggregator_channel(campaign: Path, job_id: str, bind: tuple[str, int],
                       allowed_sources: frozenset[str] | None = None) -> Channel:  # fmt: skip
    from supervisor.heartbeat.server import AggregatorServer

    return AggregatorServer(campaign, job_id, bind=bind, allowed_sources=allowed_sources)


def node_addresses(slurm: SlurmClient, nodes: tuple[str, ...], batch_host: str | None) -> dict[str, str]:
    """NodeAddr of the batch host and the allocation's nodes (127.0.0.1 on the local cluster). A node missing
    from the answer is unknown, never guessed: the bind address then fails clearly (``bind_address``) and
    the source filter is off (``resolve_sources``)."""
    out: dict[str, str] = {}
    for names in ([batch_host] if batch_host else [], list(nodes)):
        try:  # two queries: a problem with the allocation's list must not cost the bind address
            out.update(slurm.node_addresses(names))
        except SlurmError:
            continue
    return out


class Supervisor:
    resume_unknown = False  # the last checkpoint scan failed: the program finds its checkpoint itself

    def __init__(
        self,
        paths: CampaignPaths,
        spec: CampaignSpec,
        config: Config,
        env: SlurmEnv,
        slurm: SlurmClient,
        clock: Callable[[], float] = time.time,
        *,
        channel_factory: ChannelFactory = aggregator_channel,
        start_step: StepLauncher = launcher.start,
        start_probe: ProbeStarter | None = None,
        inbox: SignalInbox | None = None,
    ) -> None:
        self.paths, self.spec, self.config, self.env, self.slurm = paths, spec, config, env, slurm
        self.clock, self.channel_factory, self.start_step = clock, channel_factory, start_step
        self.job_id = env.job_id or ""
        self.start_probe = start_probe or probe.starter(self.job_id)
        self.inbox = inbox or SignalInbox()
        self.detector = Detector(config.detect)
        self.policy = config.policy
        self.ledger_config = config.ledger
        self.signatures = config.log_signatures
        self.layout = placement.Layout(
            nodes=env.nodelist, tasks_per_node=env.tasks_per_node[0] if env.tasks_per_node else 1,
            spare_nodes=config.run.spare_nodes,
        )  # fmt: skip
        journal = Journal(paths.journal, clock=clock)
        self.recorder = Recorder(journal, read(paths.journal), config.ledger)  # the journal folded once
        self.guard = Guard(self.record, clock)  # a stage's exception is journaled; supervision goes on
        self.launches = 0
        self.scheduled_end: float | None = None
        self.slot_token = secrets.token_hex(8)  # this Slurm run's slot directories get unguessable names
        self.node_addresses: dict[str, str] = {}
        self.rank_shift = 0  # ranks moved by this many nodes (after an app error that kept to one node and rank)
        self.master_ports: list[int] = []  # each launch's MASTER_PORT: a relaunch never reuses one

    @property
    def record(self) -> Callable[[dict[str, Any]], None]:
        return self.recorder.record

    # ----------------------------------------------------------------------------------------- an attempt
    def run(self) -> int:
        state = self.recorder.state
        ended_before = state.ended
        if state.timeouts is not None:  # a requeued run keeps what earlier runs learned
            self.detector.timeouts.restore(state.timeouts)
        from supervisor.checkpoint.trust import campaign_key

        self.checkpoints = CheckpointTracker(
            self.config.run.checkpoint_dir, self.record, self.clock, state.quarantined, state.best_step,
            key=campaign_key(self.paths.root), adopt_foreign=self.config.run.adopt_foreign_checkpoints,
        )  # fmt: skip
        now = self.clock()
        if not state.started:
            self.record(ev.campaign_started(now, str(self.paths.root), self.spec.command, self.job_id))
        nodes = self._query_nodes() or {}
        job, _ = self._query_job()
        down = [n for n, info in nodes.items() if info.is_down]
        died = self._death_note(state)
        for event in campaign_state.infer_previous_outcome(state, down, job, died):
            self.record(event)
        stop = campaign_state.after_supervisor_death(state, died, self.policy, now)
        if stop is not None:
            return self._end_at_start(ended_before is None, *stop)
        self.record(ev.attempt_started(now, self.job_id, self.env.restart_count, self.layout.nodes, None))
        job, _ = self._query_job()
        self.scheduled_end = (job.end_time if job is not None else None) or self.env.end_time
        try:
            self.node_addresses = node_addresses(self.slurm, self.layout.nodes, self.env.batch_host)
            host = bind_address(os.environ.get(BIND_ENV), self.node_addresses.get(self.env.batch_host or ""))
            allowed = resolve_sources(self.node_addresses.get(n) for n in self.layout.nodes)
            self.channel = GuardedChannel(self.channel_factory(self.paths.root, self.job_id, (host, 0), allowed),
                                          self.guard)
            self._compose()
            self.channel.write_address_file()
            self.agents.spawn(self.layout.nodes)
            self.agents.wait_until_reported()
            return self._supervise()
        finally:
            self._shutdown()

    def _death_note(self, state: campaign_state.CampaignState) -> str | None:
        """The batch script's line, when the previous run's supervisor died of a signal and it requeued the job."""
        from supervisor.batchwrap import read_death_note

        last = state.last_attempt
        if last is None or str(last.get("job_id")) != self.job_id:
            return None
        return read_death_note(self.paths.batch_log(self.job_id), self.job_id, int(last.get("restart", -1)))

    def _end_at_start(self, journal: bool, end: str, reason: str) -> int:
        """This run supervises nothing (``campaign_state.after_supervisor_death``): say why, end as the campaign."""
        import sys

        if journal:
            self.record(ev.campaign_ended(self.clock(), end, reason))
        print(f"supervise: {reason}", file=sys.stderr, flush=True)
        self._shutdown()
        return 0 if end == "completed" else 1

    def _compose(self) -> None:
        run = self.config.run
        self.notifier = Notifier(
            alerts_config=self.config.alerts, metrics_config=self.config.metrics, policy_config=self.policy,
            record=self.record, clock=self.clock, guard=self.guard, job_id=self.job_id, campaign=str(self.paths.root),
        )  # fmt: skip
        self.progress = ProgressLog(self.record, self.clock)  # the goodput ledger's per-rank records
        self.interval = IntervalAsker(
            run.checkpoint_interval, prior_mtbf_s=run.mtbf_prior_s, nodes=self.layout.train_nodes,
            state=self.recorder.state, record=self.record, clock=self.clock, channel=self.channel,
            flag=slot_flag("FLAG_CHECKPOINT"),
        )  # fmt: skip
        self.agents = AgentStep(
            channel=self.channel, slurm=self.slurm, start=self.start_step, record=self.record, clock=self.clock,
            nodes=self.layout.nodes, python=self.spec.python or "python3", campaign=self.paths.root,
            extra_args=["--sample-interval", str(run.agent_interval_s), "--report-interval", str(run.summary_interval_s),
                        *self._health_args(), *self._failsafe_args()],
            env=lambda: self._step_env(""), log_path=self._attempt_logs() / "agents.log", cwd=self.spec.cwd,
        )  # fmt: skip
        self.health = HealthWatch(self.record, self.clock, self.layout.nodes, on_news=self.notifier.health)
        self.prelaunch = prelaunch.Prelaunch(
            config=self.config.preflight, health=self.health, channel=self.channel,
            record=self.record, clock=self.clock, work_dir=self.paths.root / "preflight",
            python=self.spec.python or "python3", env=lambda: self._step_env(""), health_enabled=run.health_interval_s > 0,
            start=self.start_step, log_dir=self._attempt_logs,
        )  # fmt: skip
        self.nodeloss = NodeLossWatch(
            judge=nodeloss.NodeLossJudge(nodeloss.NodeLossConfig(
                floor_s=min(2.0, run.node_loss_max_s), cap_s=run.node_loss_max_s,
                probe_timeout_s=run.node_probe_timeout_s), beat_interval_s=run.summary_interval_s),
            channel=self.channel, slurm=self.slurm, start_probe=self.start_probe, record=self.record,
            clock=self.clock, nodes=self.layout.nodes, batch_host=self.env.batch_host, guard=self.guard,
        )  # fmt: skip
        self.agents.avoid = self.nodeloss.lost  # an agent is never restarted on a node found lost
        self.preemption = PreemptionPoller(lambda: self.slurm.job(self.job_id))
        self.preemption.start()
        self.time_limit = TimeLimitClock(lambda: self.scheduled_end, self._confirmed_end,
                                         float(self.config.submit.signal_lead_s), self.clock)  # fmt: skip
        self.watcher = Watcher(
            channel=self.channel, detector=self.detector, inbox=self.inbox, checkpoints=self.checkpoints,
            agents=self.agents, record=self.record, clock=self.clock, loop_interval_s=run.loop_interval_s,
            guard=self.guard, stop_requested=lambda: stop_request.path(self.paths.root).exists(),
            preempted=self.preemption.preempted, time_limit_due=self.time_limit.due,
            on_warning=self.notifier.warning, on_pass=self._metrics_pass, on_live=self._on_live,
            health=self.health, nodeloss=self.nodeloss,
        )  # fmt: skip
        jobs = JobActions(
            slurm=self.slurm, channel=self.channel, inbox=self.inbox, record=self.record, clock=self.clock,
            job_id=self.job_id, restart_count=self.env.restart_count, scheduled_end=lambda: self.scheduled_end,
        )  # fmt: skip
        self.actuators = Actuators(
            slurm=self.slurm, channel=self.channel, inbox=self.inbox, jobs=jobs, record=self.record,
            clock=self.clock, job_id=self.job_id, campaign=str(self.paths.root), alerts_config=self.config.alerts,
            checkpoint_grace_s=run.checkpoint_grace_s, ranks_of=lambda launch: self.watcher.live(launch).ranks,
            guard=self.guard, checkpoints=self.checkpoints, submit_alert=self.notifier.submit,
            budgets=self.policy.budgets,
        )  # fmt: skip

    def _confirmed_end(self) -> tuple[bool, float | None]:
        """Slurm's EndTime of the job in its newest answer (a limit extended meanwhile is kept)."""
        known, end = self.preemption.end_time()
        if known and end:
            self.scheduled_end = end
        return known, end

    def _health_args(self) -> list[str]:
        """The node agents' health checks: interval, the filesystems to watch, thresholds, GPUs per node."""
        run = self.config.run
        args = ["--health-interval", f"{run.health_interval_s:g}", "--health-fs", f"campaign={self.paths.root}"]
        if run.checkpoint_dir:  # absolute: resolved when the campaign was created (config.with_checkpoint_dir)
            args += ["--health-fs", f"checkpoint={run.checkpoint_dir}"]
        for pair in self.config.health.to_pairs():
            args += ["--health-limit", pair]
        gpus = os.environ.get("SLURM_GPUS_ON_NODE", "")
        if gpus.isdigit():  # the batch host's count, as Slurm sets it: allocations are per-node uniform
            args += ["--expect-gpus", gpus]
        return args

    def _failsafe_args(self) -> list[str]:
        """The agents' failsafe (supervisor/agent/failsafe.py): they requeue the job if this supervisor and its
        batch host are lost. Off when the batch host is unknown."""
        from slurm.hostlist import compress

        if not self.env.batch_host or self.config.run.failsafe_timeout_s <= 0:
            return []
        return ["--batch-host", self.env.batch_host, "--failsafe-timeout", str(self.config.run.failsafe_timeout_s),
                "--job-nodes", compress(list(self.layout.nodes)), "--restart-count", str(self.env.restart_count)]

    def _metrics_pass(self) -> None:
        if self.notifier.metrics is not None:
            live = getattr(self.channel, "latest", None) or self.channel.table.snapshot()
            self.notifier.update_metrics(live, self.recorder.state)

    def _shutdown(self) -> None:
        poller: PreemptionPoller | None = getattr(self, "preemption", None)
        if poller is not None:
            poller.close()
        watch: NodeLossWatch | None = getattr(self, "nodeloss", None)
        if watch is not None:
            watch.close()
        agents: AgentStep | None = getattr(self, "agents", None)
        if agents is not None:
            agents.stop(wait_s=AGENTS_STOP_AFTER_LOSS_S if watch is not None and watch.lost else 5.0)
        channel: Channel | None = getattr(self, "channel", None)
        if channel is not None:
            channel.close()
        notifier: Notifier | None = getattr(self, "notifier", None)
        if notifier is not None:
            notifier.close()  # queued alerts are sent (bounded), the metrics endpoint stops
        self.inbox.close()
        self.recorder.close()

    def _supervise(self) -> int:
        """Launch, watch, decide, act; until a decision ends this attempt."""
        excluded = self._ledger_exclusions()
        while True:
            picked = self.guard.call(CHECKPOINT_SCAN, self.checkpoints.pick_resume, default=None)
            self.resume_unknown = picked is None
            resume, resume_step = picked if picked is not None else (None, None)
            checked = self._prelaunch(excluded)
            if checked.enough:
                excluded = checked.excluded
                launch = self._launch(resume, resume_step, excluded)
                watched = self.watcher.watch(launch)
                self._final_progress(launch)
                self.watcher.journal_timeouts()
                found = self._evidence(launch, watched)
            else:  # too few nodes passed the preflight: the training does not start; the policy answers
                launch = prelaunch.not_started(self.launches, self._attempt_logs() / "preflight.log")
                watched, found = WatchResult("preflight"), checked.evidence or Evidence()
            state = self.recorder.state
            history = state.history  # the campaign before this interruption (History is immutable)
            now = self.clock()
            request = stop_request.read(self.paths.root) if watched.reason == "stop_request" else None
            interruption, decision = stop_request.respond(request) if request is not None else respond(
                found, history, state.ledger, nodes=placement.usable_nodes(self.layout, self.nodeloss.lost), needed=self.layout.train_nodes,
                config=self.policy, now=now, step_running=launch.proc.poll() is None,
                restarts_here=max(0, self.launches - 1), signatures=self.signatures,
                slurm_kills_on_node_failure=not self._no_kill(), min_needed=self.config.run.min_nodes or None,
            )  # fmt: skip
            restarts = evidence.torchrun_restarts(launch.log_path, launch.nodes, self.layout.tasks_per_node)
            self.record({**interruption.to_event(self.clock()), "launch": launch.number, "last_step": last_step(found),
                         **({"torchrun_restarts": restarts} if restarts else {})})  # torchrun's own, docs/launch.md
            outcome = self.actuators.carry_out(Situation(launch, interruption, decision, found, history))
            self._final_progress(launch)  # a checkpoint saved on the way out (preemption, time limit, cancel)
            if interruption.cls == ev.NUMERICAL:  # the launch is gone now: no checkpoint can appear after this
                self.guard.call(CHECKPOINT_SCAN, self.checkpoints.quarantine_after_divergence, default=None)
            if outcome is not None:
                if request is not None:
                    stop_request.clear(self.paths.root)
                return outcome
            excluded = placement.exclusions_of(decision)
            if any(d.kind == NODE_SILENT for d in watched.detections):  # the agents' silence is not the new launch's
                hang = self.detector.config.hang
                self.agents.wait_until_fresh(hang.node_stale_s, hang.node_silence_s)
            self.rank_shift += placement.rank_shift_after(interruption)

    def _on_live(self, live: Any) -> None:
        self.progress.observe(live)
        self.interval.observe(live)

    def _final_progress(self, launch: Launch) -> None:
        self.guard.call(DETECT, lambda: self.progress.observe(self.watcher.live(launch), final=True), default=None)

    def _prelaunch(self, excluded: tuple[str, ...]) -> prelaunch.Checked:
        """Health-unfit and markedly slow nodes left out of the next launch (docs/health.md, "Preflight")."""
        return self.guard.call(PREFLIGHT, self.prelaunch.check, self.layout.nodes, excluded, self.layout.train_nodes,
                               self.launches + 1, default=prelaunch.Checked(excluded))  # fmt: skip

    def _evidence(self, launch: Launch, watched: WatchResult) -> Evidence:
        """The one Evidence of this ending; the detections that led to it are journaled first."""
        now = self.clock()
        for d in watched.detections:
            self.record(ev.detection_event(d, now))
        job, job_known = self._query_job()
        unfit = self.guard.call(HEALTH, self._unfit, launch.nodes, default={})
        return evidence.build(
            watched, now=self.clock(), ranks=self.watcher.live(launch).ranks, sigterm_flag=slot_flag("RANK_FLAG_SIGTERM"),
            job=job, job_known=job_known, nodes=self._query_nodes(),
            log_lines=evidence.tail(launch.log_path), step_nodes=launch.nodes, job_nodes=self.layout.nodes,
            signal_lead_s=float(self.config.submit.signal_lead_s), scheduled_end=self.scheduled_end,
            tasks_per_node=self.layout.tasks_per_node, node_addresses=self.node_addresses,
            gpu_faults=health.gpu_faults(unfit), health_findings=health.detections(unfit),
        )  # fmt: skip

    def _unfit(self, nodes: tuple[str, ...]) -> dict[str, Any]:
        self.health.update(self.channel.table)
        return self.health.faults(nodes)

    def _query_job(self) -> tuple[Any, bool]:
        """Slurm's job record; a query that fails in any way (not only SlurmError) is unknown, journaled."""
        return self.guard.call(SLURM_QUERY, query_job, self.slurm, self.job_id, default=(None, False))

    def _query_nodes(self) -> Any:
        return self.guard.call(SLURM_QUERY, query_nodes, self.slurm, self.layout.nodes, default=None)

    def _ledger_exclusions(self) -> tuple[str, ...]:
        ledger = self.recorder.state.ledger
        return placement.ledger_exclusions(self.layout, ledger.excluded_nodes(self.clock()))

    def _no_kill(self) -> bool:
        """Whether Slurm keeps this job alive when one of its nodes fails (``--no-kill``, set for spare nodes)."""
        from slurm.sbatch import has_option

        return has_option(self.spec.sbatch_flags, "--no-kill", "-k")

    def _attempt_logs(self) -> Path:
        return self.paths.attempt_logs(self.job_id, self.env.restart_count)

    def _step_env(self, resume: str | None) -> dict[str, str]:
        env = dict(os.environ)
        env["SUPERVISOR_CAMPAIGN"] = str(self.paths.root)
        env[SLOT_DIR_ENV] = slot_dir_template(self.job_id, self.slot_token)
        if resume is None and (not self.config.run.checkpoint_dir or self.resume_unknown):
            env.pop("SUPERVISOR_RESUME_FROM", None)  # unknown, not "fresh start" (""): the program looks itself
        else:
            env["SUPERVISOR_RESUME_FROM"] = resume or ""
        return env

    def _launch(self, resume: str | None, resume_step: int | None, excluded: tuple[str, ...]) -> Launch:
        """One srun of the training in this attempt (journaled as ``step_launched``, the contract's name)."""
        self.launches += 1
        name = srun.training_job_name(self.launches)
        excluded = tuple(sorted(set(excluded) | self.nodeloss.lost))
        nodes = placement.step_nodes(self.layout, excluded, self.rank_shift)  # in rank order
        moved = placement.moved(self.layout, nodes)
        dist = self._dist_env(nodes, moved)  # MASTER_ADDR: rank 0's node, moved or not
        argv = srun.training(dist.wrap(self.spec.command), launch=self.launches, nodes=len(nodes),
                             tasks_per_node=self.layout.tasks_per_node,
                             exclude=excluded, nodelist=() if moved else nodes, arbitrary=moved,
                             extra=self.config.run.srun_args)  # fmt: skip
        log_path = self._attempt_logs() / f"{name}.log"
        env = {**self._step_env(resume), **dist.env}
        if moved:  # rank 0 is no longer on the first node of the step's node list: say where it is
            hosts = self._attempt_logs() / f"{name}.hosts"
            hosts.write_text(srun.hostfile_text(nodes, self.layout.tasks_per_node))
            env["SLURM_HOSTFILE"] = str(hosts)
        launched = {**ev.step_launched(self.clock(), self.launches, nodes, excluded, resume), "resume_step": resume_step,
                    "master": f"{dist.env.get('MASTER_ADDR', '')}:{dist.env.get('MASTER_PORT', '')}"}
        if moved:
            launched["rank_nodes"] = list(nodes)
        self.record(launched)
        self.detector.new_launch()
        self.progress.launched(self.launches)
        self.interval.launched()
        self.checkpoints.launched(resume_step)
        self.watcher.forget_ranks()
        proc = self.start_step(argv, env, log_path, self.spec.cwd)
        return Launch(self.launches, name, proc, log_path, time.monotonic(), nodes,
                      worker_restarts=distenv.torchrun_restarts_on(self.spec.command, os.environ))

    def _dist_env(self, nodes: tuple[str, ...], moved: bool = False) -> distenv.DistEnv:
        """torch's env:// variables (and torchrun's defaults) for this launch; the user's own win."""
        user = os.environ
        master = user.get("MASTER_ADDR") or self.node_addresses.get(nodes[0]) or nodes[0]
        port = int(user["MASTER_PORT"]) if user.get("MASTER_PORT", "").isdigit() else distenv.pick_port(
            master, self.master_ports)
        self.master_ports.append(port)
        run_id = f"{self.job_id or 'job'}-{self.env.restart_count}-{self.launches}"
        return distenv.plan(nodes, self.layout.tasks_per_node, self.node_addresses, port, user, run_id, placed=moved,
                            node_rank_flag=distenv.static_rendezvous(self.spec.command, user))

"""``supervise run``'s composition root: one attempt (one Slurm run of the job) built whole from the campaign's
config and the outside world, then handed to the supervision loop (``driver/loop.py``).

:class:`Attempt` holds the outside as ports (the Slurm client, the heartbeat channel's factory, the step launcher,
the node probe, the signal inbox, the clock; the unit tests put in-process fakes there) and the journal, folded
once. :meth:`Attempt.run` opens the attempt (``driver/opening.py``), binds the heartbeat channel on the batch
host's address, builds every part once (:func:`compose`) and runs the loop. No part reads another's state through
a callback into the loop: each is handed the parts it works with.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm import probe
from slurm.client import SlurmClient
from slurm.env import SlurmEnv
from slurm.errors import SlurmError
from slurm.hostlist import compress
from slurm.probe import ProbeStarter
from slurm.sbatch import has_option
from supervisor import stop_request
from supervisor.campaign import CampaignSpec
from supervisor.checkpoint import flushed
from supervisor.checkpoint.trust import campaign_key
from supervisor.client.layout import FLAG_CHECKPOINT
from supervisor.config import Config
from supervisor.decisions import nodeloss, placement
from supervisor.decisions.detect import Detector
from supervisor.driver import launcher
from supervisor.driver.actuators import Actuators
from supervisor.driver.agents import AgentStep
from supervisor.driver.buddy_ring import BuddyRing
from supervisor.driver.checkpoint_tracker import CheckpointTracker
from supervisor.driver.context import Context
from supervisor.driver.env_now import EnvCheck
from supervisor.driver.evidence import Gatherer, guarded_job
from supervisor.driver.guard import GuardedChannel
from supervisor.driver.health_watch import HealthWatch
from supervisor.driver.interrupts import Interrupts
from supervisor.driver.interval import IntervalAsker
from supervisor.driver.job_query import JobQuery
from supervisor.driver.launcher import TrainingLauncher
from supervisor.driver.loop import Parts, Supervisor
from supervisor.driver.memory_flush import MemoryFlush
from supervisor.driver.memory_off import MemoryOff
from supervisor.driver.memory_persist import MemoryPersist
from supervisor.driver.memory_resume import MemoryResume
from supervisor.driver.nodeloss import NodeLossWatch
from supervisor.driver.notify import Notifier
from supervisor.driver.opening import open_attempt
from supervisor.driver.ports import Channel, StepLauncher
from supervisor.driver.preempt_watch import PreemptionPoller, read_preemptibility
from supervisor.driver.prelaunch import Prelaunch
from supervisor.driver.progress import ProgressLog
from supervisor.driver.recorder import Recorder
from supervisor.driver.requeue import JobActions
from supervisor.driver.signals import SignalInbox
from supervisor.driver.site_link import SiteLink
from supervisor.driver.stall_probe import StallProbe
from supervisor.driver.standbys import Standbys
from supervisor.driver.straggler_swap import SwapJudge
from supervisor.driver.time_limit_watch import JobDeadline, TimeLimitClock
from supervisor.driver.warm_restart import WarmRestarts
from supervisor.driver.watch import Watcher
from supervisor.heartbeat.server import BIND_ENV, bind_address, resolve_sources
from supervisor.journal import Journal, read
from supervisor.paths import CampaignPaths

ChannelFactory = Callable[[Path, str, tuple[str, int], "frozenset[str] | None"], Channel]


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


class Attempt:
    def __init__(
        self, paths: CampaignPaths, spec: CampaignSpec, config: Config, env: SlurmEnv, slurm: SlurmClient,
        clock: Callable[[], float] = time.time, *, channel_factory: ChannelFactory = aggregator_channel,
        start_step: StepLauncher = launcher.start, start_probe: ProbeStarter | None = None,
        inbox: SignalInbox | None = None,
    ) -> None:  # fmt: skip
        self.paths, self.spec, self.config, self.env, self.slurm = paths, spec, config, env, slurm
        self.clock, self.channel_factory, self.start_step = clock, channel_factory, start_step
        self.start_probe = start_probe or probe.starter(env.job_id or "")
        self.inbox = inbox or SignalInbox()
        self.detector = Detector(config.detect)
        journal = Journal(paths.journal, clock=clock)
        self.recorder = Recorder(journal, read(paths.journal), config.ledger)  # the journal, folded once

    def run(self) -> int:
        ctx = Context.of(self.recorder.record, self.clock)
        state, env, config = self.recorder.state, self.env, self.config
        nodes = env.nodelist
        if state.timeouts is not None:  # a requeued run keeps what earlier runs learned
            self.detector.timeouts.restore(state.timeouts)
        parts: Parts | None = None
        try:
            ended = open_attempt(ctx, state, paths=self.paths, env=env, command=self.spec.command, nodes=nodes,
                                 slurm=self.slurm, policy=config.policy)  # fmt: skip
            if ended is not None:
                return ended
            job, _ = guarded_job(ctx, self.slurm, env.job_id or "")
            deadline_end = (job.end_time if job is not None else None) or env.end_time
            addresses = node_addresses(self.slurm, nodes, env.batch_host)
            host = bind_address(os.environ.get(BIND_ENV), addresses.get(env.batch_host or ""))
            allowed = resolve_sources(addresses.get(n) for n in nodes)
            channel = GuardedChannel(self.channel_factory(self.paths.root, env.job_id or "", (host, 0), allowed),
                                     ctx.guard)  # fmt: skip
            parts = compose(self, ctx, channel, addresses, deadline_end)
            return Supervisor(parts).run()
        except Exception as err:  # past every stage's guard: journaled before the process ends as crashed
            ctx.guard.failed("attempt", err)
            raise
        finally:
            if parts is not None:
                parts.close()
            self.inbox.close()
            self.recorder.close()


def compose(a: Attempt, ctx: Context, channel: GuardedChannel, addresses: dict[str, str],
            deadline_end: float | None) -> Parts:  # fmt: skip
    """Every part of the attempt, built once, each handed the parts it works with."""
    config, env, spec, paths, run = a.config, a.env, a.spec, a.paths, a.config.run
    job_id, state = env.job_id or "", a.recorder.state
    memory_mode = "off" if state.memory_off else run.memory_snapshots  # a store that failed: off for the campaign
    layout = placement.TrainingLayout(nodes=env.nodelist, tasks_per_node=env.tasks_per_node[0] if env.tasks_per_node else 1,
                              spare_nodes=run.spare_nodes)  # fmt: skip
    log_dir = paths.attempt_logs(job_id, env.restart_count)
    python = spec.python or "python3"
    checkpoints = CheckpointTracker(ctx, run.checkpoint_dir, state.quarantined, state.best_step,
                                    key=campaign_key(paths.root), adopt_foreign=run.adopt_foreign_checkpoints,
                                    declared=paths.declared_checkpoint_dir)  # fmt: skip
    trainer = TrainingLauncher(
        ctx, start=a.start_step, layout=layout, command=spec.command, cwd=spec.cwd, srun_args=run.srun_args,
        job_id=job_id, restart_count=env.restart_count, campaign=paths.root, log_dir=log_dir,
        node_addresses=addresses, checkpoint_dir_known=checkpoints.known, signatures=config.log_signatures,
        memory_snapshots=memory_mode,
    )  # fmt: skip
    step_env = trainer.step_env()
    notifier = Notifier(ctx, alerts_config=config.alerts, metrics_config=config.metrics, policy_config=config.policy,
                        job_id=job_id, campaign=str(paths.root), state=state)  # fmt: skip
    health = HealthWatch(ctx, layout.nodes, on_news=notifier.health)
    watch_nodes = NodeLossWatch(
        ctx, judge=nodeloss.NodeLossJudge(nodeloss.NodeLossConfig(
            floor_s=min(2.0, run.node_loss_max_s), cap_s=run.node_loss_max_s,
            probe_timeout_s=run.node_probe_timeout_s), beat_interval_s=run.summary_interval_s),
        channel=channel, slurm=a.slurm, start_probe=a.start_probe, nodes=layout.nodes, batch_host=env.batch_host,
    )  # fmt: skip
    agents = AgentStep(
        ctx, channel=channel, slurm=a.slurm, start=a.start_step, nodes=layout.nodes, python=python,
        campaign=paths.root, extra_args=agent_args(a, layout.nodes), env=step_env, log_path=log_dir / "agents.log",
        cwd=spec.cwd, avoid=watch_nodes.lost,
    )  # fmt: skip
    preemption = PreemptionPoller(JobQuery(lambda: a.slurm.job(job_id), site_job_client(config.site), job_id),
                                  settings=lambda: read_preemptibility(a.slurm, job_id))  # fmt: skip
    deadline = JobDeadline(deadline_end, preemption.end_time)
    interval = IntervalAsker(ctx, run.checkpoint_interval, prior_mtbf_s=run.mtbf_prior_s, nodes=layout.train_nodes,
                             state=state, channel=channel, flag=FLAG_CHECKPOINT)  # fmt: skip
    progress = ProgressLog(ctx)  # the goodput ledger's per-rank records
    interrupts = Interrupts(ctx, a.inbox, stop_request.path(paths.root), preemption,
                            TimeLimitClock(deadline.current, deadline.confirmed, float(config.submit.signal_lead_s),
                                           ctx.clock, refresh=preemption.refresh))  # fmt: skip
    swap = SwapJudge(state=state, policy_config=config.policy, factor=a.detector.config.straggler.factor,
                     costs=config.preflight.costs, clock=ctx.clock,
                     spares=lambda launched, now: len(set(placement.usable_nodes(layout, watch_nodes.lost))
                                                      - set(launched) - state.ledger.excluded_nodes(now)))  # fmt: skip
    key = campaign_key(paths.root)
    memory = MemoryResume(ctx, channel, enabled=memory_mode != "off", flushed=lambda: flushed.newest(paths.root, key))
    memory_flush = MemoryFlush(ctx, channel, memory, paths.root, key, enabled=memory_mode != "off")
    ring = BuddyRing(ctx, channel, lambda: watch_nodes.lost, enabled=memory_mode != "off", switches=a.slurm.switches)
    persist = MemoryPersist(ctx, channel, memory, paths.root, key, setting=run.memory_persist,
                            newest_filesystem_step=lambda: checkpoints.best_step,
                            launch_tag=lambda: trainer.launch_tag(trainer.launches), enabled=memory_mode != "off")

    def memory_tier_off() -> None:
        trainer.memory_snapshots = "off"
        memory.enabled = memory_flush.enabled = ring.enabled = persist.enabled = False

    site = SiteLink.from_config(ctx, config.site, str(paths.root), job_id, report=state.report)
    watcher = Watcher(ctx, channel=channel, detector=a.detector, checkpoints=checkpoints, agents=agents,
                      interrupts=interrupts, loop_interval_s=run.loop_interval_s, notifier=notifier,
                      observers=(progress, interval, ring, MemoryOff(ctx, channel, memory_tier_off,
                                                                       enabled=memory_mode != "off"), persist, site),
                      health=health, nodeloss=watch_nodes,
                      stall=StallProbe(ctx, channel, paths.root), swap=swap)  # fmt: skip
    standbys = Standbys(ctx, setting=run.standbys, command=spec.command, trainer=trainer, slurm=a.slurm,
                        job_id=job_id, ranks_of=watcher.ranks, tasks_per_node=trainer.ranks_per_node,
                        spares_of=lambda launch: [n for n in placement.usable_nodes(layout, watch_nodes.lost)
                                                  if n not in launch.nodes])  # fmt: skip
    watcher.standbys = standbys  # (it asks the watcher for the launch's ranks)
    jobs = JobActions(ctx, slurm=a.slurm, channel=channel, inbox=a.inbox, job_id=job_id,
                      restart_count=env.restart_count, scheduled_end=deadline.current,
                      released=lambda: site.released(spec.site_excluded,
                                                     tuple(state.ledger.excluded_nodes(ctx.clock()))))  # fmt: skip
    return Parts(
        ctx=ctx, state=state, config=config, layout=layout, paths=paths, job_id=job_id, channel=channel,
        detector=a.detector, checkpoints=checkpoints, trainer=trainer, agents=agents, health=health,
        nodeloss=watch_nodes, notifier=notifier, progress=progress, interval=interval, preemption=preemption,
        watcher=watcher, jobs=jobs, memory=memory,
        env_check=EnvCheck(ctx, python=ranks_python(spec.command, python), cwd=spec.cwd, alert=notifier.env_changed),
        prelaunch=Prelaunch(ctx, config=config.preflight, health=health, channel=channel,
                            work_dir=paths.root / "preflight", python=python, env=step_env, start=a.start_step,
                            log_dir=log_dir, health_enabled=run.health_interval_s > 0),
        gather=Gatherer(ctx, slurm=a.slurm, job_id=job_id, health=health, channel=channel, job_nodes=layout.nodes,
                        tasks_per_node=layout.tasks_per_node, signal_lead_s=float(config.submit.signal_lead_s),
                        scheduled_end=deadline.current, node_addresses=addresses, state=state),
        actuators=Actuators(
            ctx, slurm=a.slurm, channel=channel, inbox=a.inbox, jobs=jobs, job_id=job_id, campaign=str(paths.root),
            alerts_config=config.alerts, checkpoint_grace_s=run.checkpoint_grace_s, ranks_of=watcher.ranks,
            checkpoints=checkpoints, submit_alert=notifier.submit, budgets=config.policy.budgets,
            memory_flush=memory_flush, tasks_per_node=layout.tasks_per_node, memory_persist=persist,
        ),
        warm=WarmRestarts(ctx, mode=run.warm_restart, command=spec.command, channel=channel, trainer=trainer,
                          ranks_of=watcher.ranks, tasks_per_node=layout.tasks_per_node, standbys=standbys),
        standbys=standbys,
        no_kill=has_option(spec.sbatch_flags, "--no-kill", "-k"),
        site=site,
    )  # fmt: skip


def site_job_client(site: Any) -> Any:
    """A site client for the preemption poller's job reads (short timeout: it falls back to slurmctld), or None
    without ``[site] url`` or a usable token file (``SiteLink`` journals that)."""
    if not site.url:
        return None
    from supervisor.errors import SupervisorError
    from supervisor.site.client import SiteClient, read_token_file

    try:
        return SiteClient(site.url, read_token_file(Path(site.token_file).expanduser()), min(2.0, site.timeout_s))
    except SupervisorError:
        return None


def ranks_python(command: Sequence[str], python: str) -> str:
    """The interpreter the ranks run: the command's own when it names one (``python3 train.py``), else the
    campaign's (torchrun, a script with a shebang)."""
    first = command[0] if command else ""
    return first if os.path.basename(first).startswith("python") else python


def agent_args(a: Attempt, nodes: tuple[str, ...]) -> list[str]:
    """The node agents' arguments: sampling and reporting intervals, health checks, and the failsafe."""
    run, env = a.config.run, a.env
    args = ["--sample-interval", str(run.agent_interval_s), "--report-interval", str(run.summary_interval_s)]
    # health: the interval, the filesystems to watch, thresholds, GPUs per node
    args += ["--health-interval", f"{run.health_interval_s:g}", "--health-fs", f"campaign={a.paths.root}"]
    if run.checkpoint_dir:  # absolute: resolved when the campaign was created (config.with_checkpoint_dir)
        args += ["--health-fs", f"checkpoint={run.checkpoint_dir}"]
    for pair in a.config.health.to_pairs():
        args += ["--health-limit", pair]
    gpus = os.environ.get("SLURM_GPUS_ON_NODE", "")
    if gpus.isdigit():  # the batch host's count, as Slurm sets it: allocations are per-node uniform
        args += ["--expect-gpus", gpus]
    # the failsafe (supervisor/agent/failsafe.py): the agents requeue the job if this supervisor and its batch
    # host are lost; off when the batch host is unknown
    if env.batch_host and run.failsafe_timeout_s > 0:
        args += ["--batch-host", env.batch_host, "--failsafe-timeout", str(run.failsafe_timeout_s),
                 "--job-nodes", compress(list(nodes)), "--restart-count", str(env.restart_count)]  # fmt: skip
    return args

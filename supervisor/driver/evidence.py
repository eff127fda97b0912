"""Gather one complete :class:`~supervisor.decisions.classify.Evidence` about how a launch ended (or must end).

The sources: Slurm's typed job and node records (a failed query is recorded as *unknown*, never as an empty
answer), the signals the batch step received, each rank's exit and SIGTERM flag from the agents, the detections,
and the launch log's digest and tail (driver/launch_log.py). The classifier gets all of it in one record, so no field can be dropped on the way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from slurm.client import SlurmClient
from slurm.errors import SlurmError
from slurm.model import JobInfo, NodeInfo
from supervisor import procstate
from supervisor.client.layout import RANK_FLAG_ENDED_CLEAN, RANK_FLAG_SIGTERM
from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.decisions import tasklog
from supervisor.decisions.detect import DetectionEvent
from supervisor.decisions.respond import job_state_of
from supervisor.driver import flight_dumps, health_watch
from supervisor.driver.context import Context
from supervisor.driver.guard import EVIDENCE, HEALTH, SLURM_QUERY
from supervisor.driver.launch_log import LaunchLog
from supervisor.driver.signals import Received

log = structlog.get_logger("supervisor")



@dataclass(frozen=True)
class WatchResult:
    """Why the loop stopped watching a launch: ``reason`` is "exited", "detection", "signal", "stop_request"
    (``supervise cancel``), "health" (a node of the launch failed a fatal health check) or "swap" (a straggler
    is swapped for a spare: ``swap`` holds the verdict, ``detections`` the straggler warning)."""

    reason: str
    exit_code: int | None = None  # srun's, when it exited
    detections: tuple[DetectionEvent, ...] = ()
    signals: tuple[Received, ...] = ()
    time_limit_near: float | None = None  # when the supervisor's own clock found Slurm's USR1 overdue
    swap: Any = None  # decisions.straggler_swap.Verdict, for reason "swap"


def query_job(slurm: SlurmClient, job_id: str) -> tuple[JobInfo | None, bool]:
    """(the job, whether Slurm answered). None with True: slurmctld has forgotten the job."""
    try:
        return slurm.job(job_id), True
    except SlurmError as err:  # evidence gathering must never stop the response
        log.warning("slurm_query_failed", what="job", error=str(err))
        return None, False


def query_nodes(slurm: SlurmClient, nodes: Sequence[str]) -> dict[str, NodeInfo] | None:
    """Slurm's record of each node, or None when the query failed (unknown, not "all fine")."""
    try:
        return {n.name: n for n in slurm.nodes(list(nodes) or None)}
    except SlurmError as err:
        log.warning("slurm_query_failed", what="nodes", error=str(err))
        return None


def node_state_word(info: NodeInfo) -> str:
    """The word the classifier's node-state rules read: DOWN, DRAIN or UP."""
    return "DOWN" if info.is_down else "DRAIN" if info.is_drain else "UP"


def rank_exits(ranks: Sequence[Any]) -> tuple[cl.RankExit, ...]:
    """How each rank process of the launch ended, from the agents' reports (heartbeat rank views)."""
    return tuple(
        cl.RankExit(node=r.node, rank=r.rank, exit_code=r.exit_code, signal=r.exit_signal)
        for r in ranks if r.state in procstate.ENDED and (r.exit_code is not None or r.exit_signal)
    )  # fmt: skip


def merge_task_exits(agents: Sequence[cl.RankExit], workers: Sequence[cl.RankExit],
                     srun: Sequence[tasklog.TaskExit]) -> tuple[cl.RankExit, ...]:  # fmt: skip
    """The agents' exits (exact, when the rank was their child's) plus torchrun's report of its failed workers
    and srun's report of each task that they could not read (an agent cannot wait for a rank it did not start,
    so a rank killed from outside reaches us only as srun's ``srun: error: node2: task 1: Killed``)."""
    known = {x.rank for x in agents if x.rank is not None}
    extra = tuple(w for w in workers if w.rank not in known)
    known |= {w.rank for w in extra if w.rank is not None}
    extra += tuple(cl.RankExit(node=t.node, rank=t.task, exit_code=t.exit_code, signal=t.signal)
                   for t in srun if t.task not in known)  # fmt: skip
    return (*agents, *extra)


def worker_exits(log_lines: Sequence[str], step_nodes: Sequence[str]
                 ) -> tuple[tuple[cl.RankExit, ...], tuple[tasklog.TaskExit, ...]]:  # fmt: skip
    """Under ``srun torchrun`` srun's tasks are the torchruns (one per node) and the ranks their workers: a
    failed worker is known from its torchrun's failure summary, under its global rank, and srun's line for that
    torchrun (``task 1: Exited with exit code 1``: torchrun gave up) is its consequence, not a rank's exit.
    Returns (the workers' exits, the srun task exits still to read as ranks: all of them without torchrun)."""
    srun = tasklog.srun_task_exits(log_lines)
    failed = tasklog.torchrun_worker_exits(log_lines)
    if not failed:
        return (), srun
    node_of = {t.task: t.node for t in srun}
    workers = tuple(
        cl.RankExit(node=node_of.get(w.task) or (step_nodes[w.task] if w.task < len(step_nodes) else ""),
                    rank=w.rank, exit_code=w.exit_code if w.exit_code >= 0 else None,
                    signal=-w.exit_code if w.exit_code < 0 else None)
        for w in failed
    )  # fmt: skip
    tasks = {w.task for w in failed}
    # the other torchruns, ended by srun (--kill-on-bad-exit): their node is known, which worker is not
    others = tuple(cl.RankExit(node=t.node, exit_code=t.exit_code, signal=t.signal) for t in srun if t.task not in tasks)
    return (*workers, *others), ()


def build(
    watched: WatchResult,
    *,
    now: float,
    ranks: Sequence[Any],
    sigterm_flag: int,
    job: JobInfo | None,
    job_known: bool,
    nodes: Mapping[str, NodeInfo] | None,
    log_lines: Sequence[str],
    step_nodes: tuple[str, ...],
    job_nodes: tuple[str, ...],
    signal_lead_s: float,
    scheduled_end: float | None,
    tasks_per_node: int = 1,
    node_addresses: Mapping[str, str] | None = None,
    gpu_faults: Mapping[str, tuple[str, ...]] | None = None,
    health_findings: Sequence[Mapping[str, Any]] = (),
    history: Any = None,
    found_after: Sequence[tuple[float, DetectionEvent]] = (),
) -> cl.Evidence:
    """The one Evidence of an ending. ``ranks``: the launch's rank views (earlier launches' left out); ``history``:
    the campaign's ``policy.History`` (where its earlier app errors happened: a crash keeping to one node blames
    it); ``found_after``: detections made from what the ending left behind (the flight recorder's dumps), timed."""
    exits = merge_task_exits(rank_exits(ranks), *worker_exits(log_lines, step_nodes))
    if not exits and watched.exit_code is not None:
        exits = tuple(cl.RankExit(node=n, exit_code=watched.exit_code) for n in step_nodes[:1])
    unknown = (() if job_known else ("slurm_job",)) + (() if nodes is not None else ("slurm_nodes",))
    return cl.Evidence(
        job_state=job_state_of(job, scheduled_end),
        job_reason=job.reason if job is not None else None,
        end_time=job.end_time if job is not None else None,
        scheduled_end=scheduled_end,
        preempt_time=job.preempt_time if job is not None else None,
        batch_signals=tuple((s.name.removeprefix("SIG"), s.at) for s in watched.signals),
        time_limit_near=watched.time_limit_near,
        signal_lead_s=signal_lead_s,
        sigterm_ranks=tuple(r.rank for r in ranks if r.rank_flags & sigterm_flag),
        ended_clean_ranks=tuple(r.rank for r in ranks if r.rank_flags & RANK_FLAG_ENDED_CLEAN),
        rank_exits=exits,
        node_states={n: node_state_word(info) for n, info in (nodes or {}).items()},
        detections=(*((now, d) for d in watched.detections), *found_after),
        log_lines=tuple(cl.LogLine(text=line) for line in log_lines),
        allocation_nodes=step_nodes,
        task_nodes=tasklog.task_nodes(step_nodes, tasks_per_node),  # srun --label: each line's rank -> node
        node_addresses=dict(node_addresses or {}),
        job_nodes=job_nodes,
        slurm_job=job,
        slurm_nodes=dict(nodes or {}),
        unknown=unknown,
        last_steps={r.rank: r.step for r in ranks},
        gpu_faults=dict(gpu_faults or {}),  # the node agents' fatal health findings (driver/health_watch.py)
        health_findings=tuple(health_findings),
        app_error_history=history.app_error_origins if history is not None else (),
        app_error_rank_history=history.app_error_ranks if history is not None else (),
    )


def guarded_job(ctx: Context, slurm: SlurmClient, job_id: str) -> tuple[JobInfo | None, bool]:
    """Slurm's job record; a query that fails in any way (not only SlurmError) is unknown, journaled."""
    return ctx.guard.call(SLURM_QUERY, query_job, slurm, job_id, default=(None, False))


def guarded_nodes(ctx: Context, slurm: SlurmClient, nodes: Sequence[str]) -> dict[str, NodeInfo] | None:
    """Slurm's node records, or None (unknown, journaled) when the query failed in any way."""
    return ctx.guard.call(SLURM_QUERY, query_nodes, slurm, nodes, default=None)


class Gatherer:
    """Gathers the one Evidence of each ending: the detections that led to it are journaled first, then Slurm is
    asked (a failed query is journaled and listed as unknown), the health reports read, and :func:`build` makes
    the record."""

    def __init__(self, ctx: Context, *, slurm: SlurmClient, job_id: str, health: Any, channel: Any,
                 job_nodes: tuple[str, ...], tasks_per_node: int, signal_lead_s: float,
                 scheduled_end: Callable[[], float | None], node_addresses: Mapping[str, str], state: Any) -> None:  # fmt: skip
        """``state``: the campaign state (its history: where earlier app errors happened)."""
        self.ctx, self.slurm, self.job_id, self.health, self.channel = ctx, slurm, job_id, health, channel
        self.state = state
        self.job_nodes, self.tasks_per_node, self.signal_lead_s = job_nodes, tasks_per_node, signal_lead_s
        self.scheduled_end, self.node_addresses = scheduled_end, node_addresses

    def job(self) -> tuple[JobInfo | None, bool]:
        return guarded_job(self.ctx, self.slurm, self.job_id)

    def nodes(self) -> dict[str, NodeInfo] | None:
        return guarded_nodes(self.ctx, self.slurm, self.job_nodes)

    def gather(self, launch_nodes: tuple[str, ...], log: LaunchLog, watched: WatchResult,
               ranks: Sequence[Any], dumps: Path | None = None) -> cl.Evidence:  # fmt: skip
        """``ranks``: the launch's rank views (earlier launches' left out); ``log``: the launch's log; ``dumps``:
        where its ranks' flight recorders dump (``driver/flight_dumps.py``)."""
        now = self.ctx.clock()
        for d in watched.detections:
            self.ctx.record(ev.detection_event(d, now))
        lag = self.ctx.guard.call(EVIDENCE, flight_dumps.lag_detection, dumps, launch_nodes, self.tasks_per_node,
                                  default=None) if dumps is not None else None  # fmt: skip
        if lag is not None:
            self.ctx.record(ev.detection_event(lag[1], lag[0]))
        job, job_known = self.job()
        unfit = self.ctx.guard.call(HEALTH, self._unfit, launch_nodes, default={})
        return build(
            watched, now=self.ctx.clock(), ranks=ranks, sigterm_flag=RANK_FLAG_SIGTERM, job=job, job_known=job_known,
            nodes=self.nodes(), log_lines=log.lines(), step_nodes=launch_nodes, job_nodes=self.job_nodes,
            signal_lead_s=self.signal_lead_s, scheduled_end=self.scheduled_end(), tasks_per_node=self.tasks_per_node,
            node_addresses=self.node_addresses, gpu_faults=health_watch.gpu_faults(unfit),
            health_findings=health_watch.detections(unfit), history=self.state.history,
            found_after=(lag,) if lag is not None else (),
        )  # fmt: skip

    def _unfit(self, nodes: tuple[str, ...]) -> dict[str, Any]:
        self.health.update(self.channel.table)
        return self.health.faults(nodes)  # type: ignore[no-any-return]

"""Actuators on the Slurm job itself: requeue (or requeue held), wait for Slurm's own requeue, and set the
job's excluded nodes for its next run. Typed against ``slurm.client.SlurmClient``; every change is journaled."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from typing import Any

import structlog

from slurm.client import SlurmClient
from slurm.errors import SlurmError
from supervisor.decisions import events as ev
from supervisor.decisions.respond import job_state_of
from supervisor.driver.evidence import query_job
from supervisor.driver.ports import Channel
from supervisor.driver.signals import SignalInbox

log = structlog.get_logger("supervisor")

AWAIT_REQUEUE_LIMIT_S = 300.0


class JobActions:
    def __init__(
        self,
        *,
        slurm: SlurmClient,
        channel: Channel,
        inbox: SignalInbox,
        record: Callable[[dict[str, Any]], None],
        clock: Callable[[], float],
        job_id: str,
        restart_count: int,
        scheduled_end: Callable[[], float | None],
    ) -> None:
        self.slurm, self.channel, self.inbox, self.record, self.clock = slurm, channel, inbox, record, clock
        self.job_id, self.restart_count, self.scheduled_end = job_id, restart_count, scheduled_end

    def requeue(self, exclude: tuple[str, ...], hold: bool = False) -> None:
        # Ignore the SIGTERM the requeue sends us until the exclusion is set (KillWait gives us the time).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        job, _ = query_job(self.slurm, self.job_id)
        if job is not None and job_state_of(job, self.scheduled_end()) == "CANCELLED":
            # Never undo a user's or an admin's scancel, whatever the classification said.
            self.record(ev.requeue_skipped(self.clock(), "the job was cancelled"))
            return
        if hold:
            self.slurm.requeue_hold(self.job_id)
        else:
            self.slurm.requeue(self.job_id)
        if exclude:
            self.exclude(exclude)

    def await_requeue(self, exclude: tuple[str, ...] = (), limit_s: float = AWAIT_REQUEUE_LIMIT_S) -> None:
        """Slurm ends or requeues the job itself (preemption, node failure): let the ranks finish their
        checkpoint and wait for Slurm's signal, doing nothing that could tear a save. Once the requeue has
        begun (SIGTERM, job completing), the blamed nodes are excluded from the next run."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # KillWait is our time to set the exclusion
        self.inbox.drain()
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self.channel.poll(1.0)
            job, _ = query_job(self.slurm, self.job_id)
            requeued = job is None or job.is_completing or job.is_pending or job.restart_count > self.restart_count
            if requeued:
                if exclude:
                    self.exclude(exclude)
                return

    def exclude(self, nodes: tuple[str, ...]) -> None:
        job, known = query_job(self.slurm, self.job_id)
        if not known:  # (the adapter already retried with backoff)
            self.record(ev.exclusion_skipped(self.clock(), nodes, "Slurm did not answer the query for the job's "
                                             "current ExcNodeList; writing ours alone would drop the user's"))
            return
        already = tuple(job.excluded_nodes) if job is not None else ()
        # ExcNodeList is replaced, not extended: keep what the user or an earlier run excluded.
        wanted = sorted(set(already) | set(nodes))
        try:
            self.slurm.update_excluded_nodes(self.job_id, wanted)
        except SlurmError as err:  # the job still runs; the failed node is DOWN anyway
            log.warning("exclude_failed", nodes=wanted, error=str(err))
            return
        self.record(ev.nodes_excluded(self.clock(), wanted))

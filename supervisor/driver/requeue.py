"""Actuators on the Slurm job itself: requeue (or requeue held), wait for Slurm's own requeue, and set the
job's excluded nodes for its next run. Typed against ``slurm.client.SlurmClient``; every change is journaled."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import structlog

from slurm.client import SlurmClient
from slurm.errors import SlurmError
from slurm.model import JobInfo
from supervisor.decisions import events as ev
from supervisor.decisions.capacity import Room
from supervisor.decisions.respond import job_state_of
from supervisor.driver.context import Context
from supervisor.driver.evidence import query_job, query_nodes
from supervisor.driver.ports import Channel
from supervisor.driver.signals import SignalInbox

log = structlog.get_logger("supervisor")

AWAIT_REQUEUE_LIMIT_S = 300.0
# After a node loss, the requeued job may start this long after the requeue instead of Slurm's cred_expire + 1 s
# (docs/node-loss.md): long enough for this supervisor to exit and the job to complete on its live nodes first
# (Slurm keeps a StartTime still ahead when the job completes), and for the nodes to revoke the old credential.
EXPEDITED_START_S = 5


class JobActions:
    def __init__(self, ctx: Context, *, slurm: SlurmClient, channel: Channel, inbox: SignalInbox, job_id: str,
                 restart_count: int, scheduled_end: Callable[[], float | None],
                 released: Callable[[], frozenset[str]] = frozenset) -> None:  # fmt: skip
        """``scheduled_end()``: the job's EndTime as known now (``time_limit_watch.JobDeadline.current``);
        ``released()``: nodes that may leave the job's ExcNodeList at a requeue (``SiteLink.released``: excluded at
        submission for the site ledger, forgiven since)."""
        self.record, self.clock, self.released = ctx.record, ctx.clock, released
        self.slurm, self.channel, self.inbox = slurm, channel, inbox
        self.job_id, self.restart_count, self.scheduled_end = job_id, restart_count, scheduled_end

    def requeue(self, exclude: tuple[str, ...], hold: bool = False, lost: tuple[str, ...] = ()) -> None:
        """Requeue (held: ``hold``) the job without ``exclude`` in its next run. ``lost``: nodes our own verdict
        found lost; the requeue is then expedited (:meth:`_drop_lost`, :meth:`_start_soon`)."""
        # Ignore the SIGTERM the requeue sends us until the exclusion is set (KillWait gives us the time).
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        job, _ = query_job(self.slurm, self.job_id)
        if job is not None and job_state_of(job, self.scheduled_end()) == "CANCELLED":
            # Never undo a user's or an admin's scancel, whatever the classification said.
            self.record(ev.requeue_skipped(self.clock(), "the job was cancelled"))
            return
        errors: list[str] = []
        dropped = self._drop_lost(job, lost, errors) if lost else ()
        if hold:
            self.slurm.requeue_hold(self.job_id)
        else:
            self.slurm.requeue(self.job_id)
        if exclude or self.released():
            self.exclude(exclude)
        if lost:
            start = self._start_soon(errors) if not hold else None
            self.record(ev.requeue_expedited(self.clock(), dropped, start, errors))

    def _drop_lost(self, job: JobInfo | None, lost: tuple[str, ...], errors: list[str]) -> tuple[str, ...]:
        """Take the lost nodes out of the running allocation before the requeue: a requeued job stays COMPLETING
        until every node of it answered or was marked DOWN (SlurmdTimeout later); without them it completes as
        soon as its live nodes have. Never the batch host (Slurm refuses), never all nodes."""
        nodes = tuple(job.nodes) if job is not None else ()
        drop = tuple(n for n in nodes if n in set(lost) and job is not None and n != job.batch_host)
        keep = [n for n in nodes if n not in set(drop)]
        if not drop or not keep or not self._resize_keeps_job_updatable(errors):
            return ()
        try:
            self.slurm.shrink_job(self.job_id, keep)
        except SlurmError as err:
            errors.append(f"shrink to {','.join(keep)}: {err}")
            return ()
        return drop

    def _resize_keeps_job_updatable(self, errors: list[str]) -> bool:
        """A resized job gets a new accounting record, and Slurm (22.05, 24.11) refuses every update of the job
        until it has one (ESLURM_JOB_SETTING_DB_INX, retried 5 s inside slurmctld). slurmdbd answers at once;
        without it the record comes only when the job has completed, which it cannot while we (its batch script)
        wait to write the exclusion: KillWait would SIGKILL us first. So: shrink only with slurmdbd."""
        try:
            storage = self.slurm.config().get("AccountingStorageType", "")
        except SlurmError as err:
            storage = f"unknown ({err})"
        if storage == "accounting_storage/slurmdbd":
            return True
        errors.append(f"not shrunk: AccountingStorageType is {storage or 'unknown'}, not slurmdbd")
        return False

    def _start_soon(self, errors: list[str]) -> int | None:
        """Slurm holds a requeued job PENDING (BeginTime) for AuthInfo's cred_expire + 1 s (121 s by default),
        unless its StartTime is still ahead when it completes: set it EXPEDITED_START_S ahead."""
        try:
            self.slurm.set_start_time(self.job_id, EXPEDITED_START_S)
        except SlurmError as err:
            errors.append(f"StartTime: {err}")
            return None
        return EXPEDITED_START_S

    def room(self, job_nodes: int) -> Room | None:
        """The job's partitions with every node they hold (whatever its state) and its ExcNodeList, for a job of
        ``job_nodes`` nodes; None when Slurm did not say all of it (two queries, asked only before a requeue)."""
        job, known = query_job(self.slurm, self.job_id)
        if job is None or not known or not job.partition:
            return None
        everyone = query_nodes(self.slurm, ())
        if not everyone or not any(info.partitions for info in everyone.values()):
            return None  # no answer, or this Slurm's node records do not name their partitions: not "none"
        partitions = set(job.partition.split(","))
        nodes = frozenset(n for n, info in everyone.items() if partitions & set(info.partitions))
        return Room(job.partition, nodes, job_nodes, frozenset(job.excluded_nodes))

    def await_requeue(self, exclude: tuple[str, ...] = (), limit_s: float = AWAIT_REQUEUE_LIMIT_S,
                      hold: bool = False) -> None:  # fmt: skip
        """Slurm ends or requeues the job itself (preemption, node failure): let the ranks finish their
        checkpoint and wait for Slurm's signal, doing nothing that could tear a save. Once the requeue has
        begun (SIGTERM, job completing), the blamed nodes are excluded from the next run, and the job is held
        (``hold``) when it could never start without them."""
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # KillWait is our time to set the exclusion
        self.inbox.drain()
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            self.channel.poll(1.0)
            job, _ = query_job(self.slurm, self.job_id)
            requeued = job is None or job.is_completing or job.is_pending or job.restart_count > self.restart_count
            if requeued:
                if exclude or self.released():
                    self.exclude(exclude)
                if hold:
                    try:
                        self.slurm.hold(self.job_id)
                    except SlurmError as err:
                        self.record(ev.requeue_skipped(self.clock(), f"the hold was refused: {err}"))
                return

    def exclude(self, nodes: tuple[str, ...]) -> None:
        job, known = query_job(self.slurm, self.job_id)
        if not known:  # (the adapter already retried with backoff)
            self.record(ev.exclusion_skipped(self.clock(), nodes, "Slurm did not answer the query for the job's "
                                             "current ExcNodeList; writing ours alone would drop the user's"))
            return
        already = tuple(job.excluded_nodes) if job is not None else ()
        # ExcNodeList is replaced, not extended: keep what the user or an earlier run excluded, less what the
        # site excluded at submission and has forgiven since
        released = (self.released() & set(already)) - set(nodes)
        wanted = sorted((set(already) - released) | set(nodes))
        if not nodes and not released:
            return
        try:
            self.slurm.update_excluded_nodes(self.job_id, wanted)
        except SlurmError as err:  # the job still runs; the failed node is DOWN anyway
            log.warning("exclude_failed", nodes=wanted, error=str(err))
            return
        self.record(ev.nodes_excluded(self.clock(), wanted, released))

"""The job's record, asked in the background: whether Slurm preempted it, and its EndTime now.

Slurm should send the batch shell the user signal when it preempts a job with a grace time
(``preempt_send_user_signal``), but on the local 22.05 cluster 1 preemption in 3 sent none (a plain bash batch
script trapping USR1 saw nothing, then SIGTERM at the grace time's end): the grace time passed unused and the
work since the last checkpoint was lost. So the job's ``preempt_time`` is also read in a thread, as often as the
partition's preemption settings require (``decisions.slurm_poll``: read once, at the start; a quarter of the grace
time, or every 5 minutes when the job cannot be preempted): a query that hangs or retries while slurmctld is away
never holds up the watch loop, and a failed query is simply "not known to be preempted" (the signal path still
works). The same answers give the job's EndTime, which the time-limit clock (driver/time_limit_watch.py)
confirms itself with; it asks for a fresh answer when it needs one (``refresh``) instead of a fast steady poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import structlog

from supervisor.decisions.slurm_poll import FLOOR_S, UNKNOWN, Preemptibility, poll_period, preemptibility

log = structlog.get_logger(__name__)


class PreemptionPoller:
    def __init__(self, query_job: Callable[[], Any], period_s: float = FLOOR_S,
                 settings: Callable[[], Preemptibility] | None = None) -> None:  # fmt: skip
        """``query_job()``: the job's record (an object with ``preempt_time``), None, or raises; ``settings()``:
        the partition's preemption settings, read once in the thread before the first query (raises: unknown);
        without it, every ``period_s``."""
        self.query_job, self.period_s, self.settings = query_job, period_s, settings
        self.preemptibility: Preemptibility | None = None  # as read at the start (None: not yet, or no reader)
        self.queries = 0
        self._seen = threading.Event()
        self._end: tuple[bool, float | None] = (False, None)  # (Slurm answered this run, the job's EndTime)
        self._answer_asked_at = -1.0  # monotonic: when the query behind the newest answer was sent
        self._fresh_after = 0.0  # monotonic: an answer counts only if asked after this (``refresh``)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="preempt-poll", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        if self.settings is not None:
            try:
                found = self.settings()
            except Exception as err:  # noqa: BLE001 - unknown settings: the cautious period
                log.debug("preempt_settings_failed", error=str(err))
                found = UNKNOWN
            self.preemptibility, self.period_s = found, poll_period(found)
            log.info("slurm_poll_period", period_s=self.period_s, why=found.why)
        first = True  # asked at once: the EndTime is known from the start
        while True:
            if not first:
                self._wake.wait(self.period_s)
            first = False
            self._wake.clear()
            if self._stop.is_set():
                return
            asked_at = time.monotonic()
            self.queries += 1
            try:
                job = self.query_job()
            except Exception as err:  # noqa: BLE001 - a failed query decides nothing
                log.debug("preempt_poll_failed", error=str(err))
                continue
            if job is not None:
                self._end = (True, getattr(job, "end_time", None))
                # a read the site service made earlier counts from when it was made (``driver/job_query.py``)
                self._answer_asked_at = asked_at - float(getattr(job, "age_s", 0.0) or 0.0)
            if getattr(job, "preempt_time", None):
                self._seen.set()

    def refresh(self) -> None:
        """Ask Slurm now; ``end_time`` says "not known" until that answer came."""
        self._fresh_after = time.monotonic()
        self._wake.set()

    def preempted(self) -> bool:
        return self._seen.is_set()

    def end_time(self) -> tuple[bool, float | None]:
        """(whether Slurm has answered since the start and since the last ``refresh``, the job's EndTime in its
        newest answer; None: no limit)."""
        known, end = self._end
        return known and self._answer_asked_at >= self._fresh_after, end

    def close(self) -> None:
        self._stop.set()
        self._wake.set()


def read_preemptibility(slurm: Any, job_id: str) -> Preemptibility:
    """The job's partition's preemption settings, from three queries made once per Slurm run (the job, the
    partition, slurmctld's config); raises what the Slurm client raises (the poller then assumes the worst)."""
    job = slurm.job(job_id)
    name = getattr(job, "partition", None)
    if not name or "," in name:  # a pending job may list several: not known which one runs it
        return UNKNOWN
    return preemptibility(slurm.config(), slurm.partition(name))

"""The job's record, asked in the background: whether Slurm preempted it, and its EndTime now.

Slurm should send the batch shell the user signal when it preempts a job with a grace time
(``preempt_send_user_signal``), but on the local 22.05 cluster 1 preemption in 3 sent none (a plain bash batch
script trapping USR1 saw nothing, then SIGTERM at the grace time's end): the grace time passed unused and the
work since the last checkpoint was lost. So the job's ``preempt_time`` is also read every ``period_s``, in a
thread: a query that hangs or retries while slurmctld is away never holds up the watch loop, and a failed query
is simply "not known to be preempted" (the signal path still works). The same answers give the job's EndTime,
which the time-limit clock (driver/time_limit_watch.py) confirms itself with, without a query of its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger(__name__)


class PreemptionPoller:
    def __init__(self, query_job: Callable[[], Any], period_s: float = 3.0) -> None:
        """``query_job()``: the job's record (an object with ``preempt_time``), None, or raises."""
        self.query_job, self.period_s = query_job, period_s
        self._seen = threading.Event()
        self._end: tuple[bool, float | None] = (False, None)  # (Slurm answered this run, the job's EndTime)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="preempt-poll", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            try:
                job = self.query_job()
            except Exception as err:  # noqa: BLE001 - a failed query decides nothing
                log.debug("preempt_poll_failed", error=str(err))
                continue
            if job is not None:
                self._end = (True, getattr(job, "end_time", None))
            if getattr(job, "preempt_time", None):
                self._seen.set()

    def preempted(self) -> bool:
        return self._seen.is_set()

    def end_time(self) -> tuple[bool, float | None]:
        """(whether Slurm has answered since the start, the job's EndTime in its newest answer; None: no limit)."""
        return self._end

    def close(self) -> None:
        self._stop.set()

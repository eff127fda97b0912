"""One Slurm query for every campaign's job (issue 25): the site service reads the jobs its campaigns ask about
with one ``squeue`` every ``PERIOD_S``, and each campaign's preemption poller asks the service instead of
slurmctld. A thousand campaigns on preemptible partitions then cost slurmctld 20 RPC/min in all, not 20 each.

A job is read while its campaign asks about it often (two asks at most ``HOT_GAP_S`` apart, the last one no
longer ago than that: a poller on a short-grace partition); a campaign that asks once per 5 minutes (its job
cannot be preempted) would find any read stale by then, so its job is not read for it at all: it asks slurmctld
itself, as without a site. Nothing is queried while no job is read. An answer carries when Slurm was read, so a campaign can tell a stale one (a failed query here,
a busy service) and ask slurmctld itself; a job Slurm no longer lists is said as such ("found": false), never
guessed from a failed query. Polls and acts only.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

PERIOD_S = 3.0  # the preemption poller's floor: what a campaign on a short-grace partition asks at
WATCH_TTL_S = 600.0  # a job nobody asked about for this long is forgotten
HOT_GAP_S = 30.0  # a job asked about at least this often is read every round


class JobWatch:
    def __init__(self, slurm: Any, clock: Callable[[], float] = time.time, period_s: float = PERIOD_S,
                 log: Callable[[str], None] = lambda line: None) -> None:  # fmt: skip
        """``slurm``: a ``SlurmClient`` (``jobs(ids)``: one RPC for all of them)."""
        self.slurm, self.clock, self.period_s, self.log = slurm, clock, period_s, log
        self._asked: dict[str, float] = {}  # job id -> when a campaign last asked
        self._gap: dict[str, float] = {}  # job id -> the time between its last two asks
        self._read: dict[str, dict[str, Any]] = {}  # job id -> its last answer
        self._lock = threading.Lock()
        self._failing = False
        self.queries = 0

    def answer(self, job_id: str) -> dict[str, Any]:
        """The newest read of ``job_id`` (``read_at`` None: not read yet); the job is watched from now on."""
        with self._lock:
            now = self.clock()
            if job_id in self._asked:
                self._gap[job_id] = now - self._asked[job_id]
            self._asked[job_id] = now
            return dict(self._read.get(job_id) or {"job": job_id, "read_at": None, "found": None})

    def round(self) -> None:
        """One query for every job asked about often (none: nothing asked of Slurm)."""
        now = self.clock()
        with self._lock:
            for job in [j for j, t in self._asked.items() if now - t > WATCH_TTL_S]:
                del self._asked[job]
                self._gap.pop(job, None)
                self._read.pop(job, None)
            wanted = sorted(j for j, t in self._asked.items()
                            if now - t <= HOT_GAP_S and self._gap.get(j, float("inf")) <= HOT_GAP_S)
        if not wanted:
            return
        self.queries += 1
        try:
            found = {j.job_id: j for j in self.slurm.jobs(wanted)}
        except Exception as err:  # noqa: BLE001 - unknown: the answers age, campaigns ask slurmctld themselves
            if not self._failing:
                self.log(f"job watch: the Slurm query failed ({err}); campaigns ask slurmctld until it works")
            self._failing = True
            return
        if self._failing:
            self.log("job watch: the Slurm query works again")
        self._failing = False
        read_at = self.clock()
        with self._lock:
            for job in wanted:
                info = found.get(job)
                self._read[job] = {"job": job, "read_at": read_at, "found": info is not None,
                                   "state": getattr(info, "state", None),
                                   "preempt_time": getattr(info, "preempt_time", None),
                                   "end_time": getattr(info, "end_time", None)}  # fmt: skip


def serve_job_watch(watch: JobWatch, stop: threading.Event) -> None:
    """Rounds every ``period_s`` until ``stop``; a failed round is the next one's to retry."""
    while not stop.wait(watch.period_s):
        try:
            watch.round()
        except Exception as err:  # noqa: BLE001 - the service never dies of it
            watch.log(f"job watch: round failed ({err})")

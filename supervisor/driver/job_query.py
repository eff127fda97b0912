"""The preemption poller's question "what does Slurm say of my job?" asked of the site service when the campaign
has one (``[site] url``; ``site/job_watch.py`` reads every campaign's job with one Slurm query), else of
slurmctld. Polls only; never decides.

The site's answer is used only when it is a read of Slurm no older than ``max_age_s`` (two of the service's
periods and a margin; a clock skew of a few seconds tolerated): a site that is down, slow, not watching or
stale leaves the question to slurmctld, and a site that failed is not asked again for ``BACKOFF_S`` (a poll
never waits on a dead service twice in a row). "Slurm no longer lists the job" from the site is the same None
the direct query gives; a failed query is never an answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.site.job_watch import PERIOD_S

BACKOFF_S = 60.0
SKEW_S = 5.0


@dataclass(frozen=True)
class SiteJobRead:
    """What the poller needs of a job record, as the site read it ``age_s`` seconds ago."""

    preempt_time: int | None
    end_time: int | None
    age_s: float


def _stamp(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


class JobQuery:
    def __init__(self, slurm_job: Callable[[], Any], site: Any, job_id: str, clock: Callable[[], float] = time.time,
                 max_age_s: float = 2 * PERIOD_S + 2.0) -> None:  # fmt: skip
        """``slurm_job()``: the direct query (``SlurmClient.job``); ``site``: a ``SiteClient`` or None."""
        self.slurm_job, self.site, self.job_id, self.clock, self.max_age_s = slurm_job, site, job_id, clock, max_age_s
        self.skip_site_until = float("-inf")
        self.via_site = self.via_slurm = 0

    def __call__(self) -> Any:
        read = self._from_site() if self.site is not None and self.clock() >= self.skip_site_until else None
        if read is not None:
            self.via_site += 1
            return read[0]
        self.via_slurm += 1
        return self.slurm_job()

    def _from_site(self) -> tuple[SiteJobRead | None] | None:
        """(the job, or None when Slurm no longer lists it), or None when the site's answer cannot be used."""
        from supervisor.errors import SupervisorError

        try:
            answer = self.site.request("GET", f"/v1/job-state?job={self.job_id}")
        except SupervisorError:
            self.skip_site_until = self.clock() + BACKOFF_S
            return None
        read_at = answer.get("read_at")
        if not answer.get("watching") or not isinstance(read_at, (int, float)) or isinstance(read_at, bool):
            return None  # not watched there, or not read yet: the first answers come from slurmctld
        age = self.clock() - float(read_at)
        if not -SKEW_S <= age <= self.max_age_s or answer.get("found") not in (True, False):
            return None
        if answer["found"] is False:
            return (None,)
        return (SiteJobRead(_stamp(answer.get("preempt_time")), _stamp(answer.get("end_time")), max(0.0, age)),)

"""The time limit, when Slurm's warning never reached the supervisor.

``--signal=B:USR1@T`` is sent once. The batch script starts the supervisor with USR1 ignored until it listens
(supervisor/batchwrap.py: a USR1 then can no longer kill it), so a warning that comes during its start-up - a job
that starts with less than T left, or Slurm sending it early, which it may by up to a minute - is gone, and the
ranks would meet the time limit with no checkpoint asked for. So the supervisor keeps its own clock: once the
job's EndTime is closer than T (less a margin that lets Slurm's own signal come first), it checks the EndTime in
Slurm's newest answer (a user or an admin may have extended the limit; the answers come from the preemption
poller's background queries, so the watch loop never waits on Slurm) and, confirmed, acts as the warning would
have. Once per Slurm run. Without an answer from Slurm nothing is decided.
"""

from __future__ import annotations

from collections.abc import Callable

WARNING_MARGIN_S = 3.0  # Slurm's USR1 is due T s before the end: give it these seconds to come first


def warning_due(now: float, end: float | None, lead_s: float, margin_s: float = WARNING_MARGIN_S) -> bool:
    """Whether the time limit's warning is overdue at ``now`` (no end: no time limit, never)."""
    return end is not None and now >= end - lead_s + margin_s


class TimeLimitClock:
    def __init__(self, scheduled_end: Callable[[], float | None],
                 confirmed_end: Callable[[], tuple[bool, float | None]], lead_s: float,
                 clock: Callable[[], float], refresh: Callable[[], None] = lambda: None) -> None:  # fmt: skip
        """``scheduled_end()``: the EndTime known now; ``confirmed_end()``: (whether Slurm has answered since the
        last ``refresh()``, the EndTime in its newest answer; None: no time limit); ``refresh()``: ask Slurm now
        (the background query is slow when nothing else needs it: ``decisions.slurm_poll``)."""
        self.scheduled_end, self.confirmed_end, self.lead_s, self.clock = scheduled_end, confirmed_end, lead_s, clock
        self.refresh = refresh
        self.fired_at: float | None = None
        self.asked = False  # a fresh answer was asked for since the warning became due

    def due(self) -> bool:
        """True once, when a fresh answer of Slurm's confirms that the warning is overdue."""
        now = self.clock()
        if self.fired_at is not None or not warning_due(now, self.scheduled_end(), self.lead_s):
            return False
        if not self.asked:
            self.asked = True
            self.refresh()
        known, end = self.confirmed_end()
        if not known:
            return False
        if not warning_due(now, end, self.lead_s):
            self.asked = False  # extended: ask again when the new end comes near
            return False
        self.fired_at = now
        return True


class JobDeadline:
    """The job's EndTime as this attempt knows it: Slurm's at the start (else ``SLURM_JOB_END_TIME``), then the one
    in the preemption poller's newest answer once the time-limit clock confirms with it (a limit extended meanwhile
    is kept). Read by the clock, the requeue (a cancel shows on 22.05 only through EndTime) and the evidence."""

    def __init__(self, end: float | None, answers: Callable[[], tuple[bool, float | None]]) -> None:
        """``answers()``: (whether Slurm has answered, the EndTime in its newest answer; None: no time limit)."""
        self.end, self.answers = end, answers

    def current(self) -> float | None:
        return self.end

    def confirmed(self) -> tuple[bool, float | None]:
        known, end = self.answers()
        if known and end:
            self.end = end
        return known, end

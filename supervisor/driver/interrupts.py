"""Reasons from outside the training to end the watch of a launch: a signal to the batch step (Slurm's USR1 before
the time limit or at a preemption, TERM), the user's stop request (``supervise cancel``), Slurm's preempt time
(its signal may never come), and the time limit's warning found overdue by the supervisor's own clock.

One part, asked once per pass of the watch: each source is looked at no more often than it needs (the campaign
directory once a second, the preemption poller's answer twice a second), and a source that fails is journaled
(``driver/guard.py``) and reads as "nothing to say".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from supervisor.driver.context import Context
from supervisor.driver.guard import CHECKPOINT_SCAN, DETECT, SLURM_QUERY
from supervisor.driver.preempt_watch import PreemptionPoller
from supervisor.driver.signals import Received, SignalInbox
from supervisor.driver.time_limit_watch import TimeLimitClock

STOP_CHECK_S = 1.0  # how often the campaign directory is looked at for a user's stop request
PREEMPT_CHECK_S = 0.5  # how often the preemption poller's answer is looked at (driver/preempt_watch.py)


@dataclass(frozen=True)
class Interrupt:
    """Why the watch must end: ``reason`` is "signal" or "stop_request"; ``signals`` what the batch step got;
    ``time_limit_near`` when the supervisor's own clock found the time limit's warning overdue."""

    reason: str
    signals: tuple[Received, ...] = ()
    time_limit_near: float | None = None


class Interrupts:
    def __init__(self, ctx: Context, inbox: SignalInbox, stop_file: Path, preemption: PreemptionPoller,
                 time_limit: TimeLimitClock) -> None:  # fmt: skip
        self.ctx, self.inbox, self.stop_file = ctx, inbox, stop_file
        self.preemption, self.time_limit = preemption, time_limit
        self.next_stop_check = 0.0
        self.next_preempt_check = time.monotonic() + PREEMPT_CHECK_S

    def watching(self) -> None:
        """A new launch is watched: its first pass looks at the stop request at once."""
        self.next_stop_check = 0.0
        self.next_preempt_check = time.monotonic() + PREEMPT_CHECK_S

    def check(self) -> Interrupt | None:
        received = self.inbox.drain()
        if received:
            return Interrupt("signal", signals=tuple(received))
        now, guard = time.monotonic(), self.ctx.guard
        if now >= self.next_stop_check:
            self.next_stop_check = now + STOP_CHECK_S
            if guard.call(CHECKPOINT_SCAN, self.stop_file.exists, default=False):
                return Interrupt("stop_request")
        if now >= self.next_preempt_check:
            self.next_preempt_check = now + PREEMPT_CHECK_S
            if guard.call(SLURM_QUERY, self.preemption.preempted, default=False):  # Slurm's signal may never come
                return Interrupt("signal")  # the evidence reads the job's preempt_time
            if guard.call(DETECT, self.time_limit.due, default=False):
                return Interrupt("signal", time_limit_near=self.ctx.clock())
        return None

"""A simulated campaign as journal events, so the simulation can be drawn (``report --plot``) and checked against
the report's own fold of the same events. Pure: events go to a callable.

Time is the simulation's, shifted by ``base_t`` (a unix time, so the pictures have dates); one training step is
one second of compute, so a step number is the compute kept so far. Events are the ones the supervisor loop
writes: ``attempt_started`` / ``attempt_ended`` per Slurm run, ``preflight`` (with its duration),
``step_launched`` (with ``resume_step``), ``step_progress`` (the first step after the restart, the last step
before a fault), ``checkpoint_stall`` per checkpoint phase, ``checkpoint_committed`` once written,
``detection`` for hangs (its ``duration_s`` is the detection latency), ``interruption`` (class, blamed nodes,
``last_step``), and at the end of the simulated horizon a completion as the loop writes one (``interruption``
``completed``, ``attempt_ended``, ``campaign_ended`` with state ``completed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from supervisor.decisions import events as ev

Event = dict[str, Any]
JOB = "sim"


class SimJournal:
    def __init__(self, sink: Callable[[Event], None], base_t: float = 1_767_225_600.0) -> None:  # 2026-01-01
        self.sink, self.base = sink, base_t
        self.restart = 0
        self.launch = 0

    def _at(self, t: float) -> float:
        return round(self.base + t, 3)

    def started(self, campaign: str, nodes: Sequence[str]) -> None:
        self.sink(ev.campaign_started(self._at(0.0), campaign, ["simulated"], JOB))
        self.sink(ev.attempt_started(self._at(0.0), JOB, 0, nodes, None))

    def launched(self, t: float, t_first: float, nodes: Sequence[str], resume_step: int) -> None:
        """A launch at ``t`` whose first step (start-up and restore done) comes at ``t_first``."""
        self.launch += 1
        self.sink({**ev.step_launched(self._at(t), self.launch, nodes, resume_from=f"step_{resume_step}"),
                   "resume_step": resume_step})  # fmt: skip
        self.sink(ev.step_progress(self._at(t_first), self.launch, resume_step, self._at(t_first), len(nodes)))

    def preflight(self, t_end: float, seconds: float) -> None:
        self.sink(ev.preflight(self._at(t_end), [], seconds))

    def run(self, up: float, end: float, interval_s: float, stall_s: float, write_s: float, resume_step: int,
            last_step: int, final: bool) -> None:  # fmt: skip
        """One stretch of training from ``up`` to ``end``: a stall after every ``interval_s`` of compute (cut
        short by the end), committed ``write_s`` after it if the run lasts that long, and the last step."""
        period = interval_s + stall_s
        k = 1
        while up + k * period - stall_s < end:
            step = resume_step + round(k * interval_s)
            stop = min(up + k * period, end)
            stall = stop - (up + k * period - stall_s)
            if stall > 0:
                self.sink(ev.checkpoint_stall(self._at(stop), self.launch, step, round(stall, 3), self._at(stop), 1))
            if up + k * period + write_s <= end:
                self.sink({**ev.checkpoint_committed(self._at(up + k * period + write_s), step, f"step_{step}",
                                                     stall_s), "stall_s": stall_s})  # fmt: skip
            k += 1
        if not final:
            self.sink(ev.step_progress(self._at(end), self.launch, last_step, self._at(end), 1))

    def interrupted(self, t: float, detect_s: float, hang: bool, cls: str, blamed: Sequence[str],
                    evidence: Sequence[str], last_step: int, node: str) -> None:  # fmt: skip
        if hang:
            self.sink({"type": ev.DETECTION, "t": self._at(t), "kind": "rank_hang", "ranks": [0], "nodes": [node],
                       "duration_s": detect_s, "evidence": [f"rank 0 on {node} made no progress"]})  # fmt: skip
        self.sink({**ev.interruption_event(self._at(t), cls, blamed, 0.9, evidence), "last_step": last_step,
                   "launch": self.launch})  # fmt: skip

    def requeued(self, t_end: float, cls: str, blamed: Sequence[str], last_step: int) -> None:
        self.sink(ev.attempt_ended(self._at(t_end), JOB, cls, blamed, (), last_step))

    def allocated(self, t: float, nodes: Sequence[str]) -> None:
        self.restart += 1
        self.launch = 0
        self.sink(ev.attempt_started(self._at(t), JOB, self.restart, nodes, None))

    def finished(self, t: float, last_step: int) -> None:
        """The horizon: training ends there (its state is kept, as a completed campaign's), written as the loop
        writes a completion: the launch's interruption (``completed``), the Slurm run's end, the campaign's."""
        self.sink(ev.step_progress(self._at(t), self.launch, last_step, self._at(t), 1))
        self.sink({**ev.interruption_event(self._at(t), "completed", (), 0.95, ("end of the simulated horizon",)),
                   "last_step": last_step, "launch": self.launch})  # fmt: skip
        self.sink(ev.attempt_ended(self._at(t), JOB, "completed", (), (), last_step))
        self.sink(ev.campaign_ended(self._at(t), "completed", "end of the simulated horizon"))

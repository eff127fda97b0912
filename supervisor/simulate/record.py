"""A simulated campaign as journal events, so the simulation can be drawn (``report --plot``) and checked against
the report's own fold of the same events. Pure: events go to a callable.

Time is the simulation's, shifted by ``base_t`` (a unix time, so the pictures have dates); one training step is
one second of compute, so a step number is the compute kept so far. Events are the ones the supervisor loop
writes: ``attempt_started`` / ``attempt_ended`` per Slurm run, ``step_launched`` (at the first step after the
restart, with ``resume_step``), ``checkpoint_committed`` (with the stall the ranks spent, ``stall_s``),
``detection`` for hangs (its ``duration_s`` is the detection latency), ``interruption`` (class, blamed nodes,
``last_step``), and ``campaign_ended`` (state ``stopped``) at the end of the simulated horizon.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from supervisor.decisions import events as ev

Event = dict[str, Any]
JOB = "sim"


class Recorder:
    def __init__(self, sink: Callable[[Event], None], base_t: float = 1_767_225_600.0) -> None:  # 2026-01-01
        self.sink, self.base = sink, base_t
        self.restart = 0
        self.launch = 0

    def _at(self, t: float) -> float:
        return round(self.base + t, 3)

    def started(self, campaign: str, nodes: Sequence[str]) -> None:
        self.sink(ev.campaign_started(self._at(0.0), campaign, ["simulated"], JOB))
        self.sink(ev.attempt_started(self._at(0.0), JOB, 0, nodes, None))

    def launched(self, t: float, nodes: Sequence[str], resume_step: int) -> None:
        self.launch += 1
        self.sink({**ev.step_launched(self._at(t), self.launch, nodes, resume_from=f"step_{resume_step}"),
                   "resume_step": resume_step})  # fmt: skip

    def checkpoints(self, up: float, count: int, interval_s: float, stall_s: float, write_s: float,
                    resume_step: int) -> None:  # fmt: skip
        period = interval_s + stall_s
        for k in range(1, count + 1):
            step = resume_step + round(k * interval_s)
            self.sink({**ev.checkpoint_committed(self._at(up + k * period + write_s), step, f"step_{step}", stall_s),
                       "stall_s": stall_s})  # fmt: skip

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

    def finished(self, t: float) -> None:
        self.sink(ev.campaign_ended(self._at(t), "stopped", "end of the simulated horizon"))

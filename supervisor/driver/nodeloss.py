"""NodeLossWatch: feeds the pure node-loss judge (``decisions/nodeloss.py``) and carries out its probes.

Each pass it reads the heartbeat table (each node's staleness, its ranks' beat ages), asks Slurm about the
suspects only (NOT_RESPONDING/DOWN, at most every ``SLURM_CHECK_S``), starts a probe per new suspect without
waiting for it (``slurm/probe.py``), collects the probes that answered, and journals every verdict as
``node_loss_verdict``. A node found lost becomes a ``node_lost`` detection for the watch; it is remembered,
so it is never watched, relaunched on, or given an agent again in this attempt.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from slurm.errors import SlurmError
from slurm.probe import Probe, ProbeStarter
from supervisor.decisions import nodeloss as nl
from supervisor.decisions.detect import NODE_LOST, DetectionEvent
from supervisor.decisions.detect.findings import of_silence
from supervisor.driver.context import Context
from supervisor.driver.guard import SLURM_QUERY
from supervisor.driver.ports import Channel

SLURM_CHECK_S = 2.0  # while some node is suspect, Slurm's view of the suspects is read at most this often


class NodeLossWatch:
    def __init__(self, ctx: Context, *, judge: nl.NodeLossJudge, channel: Channel, slurm: Any,
                 start_probe: ProbeStarter, nodes: tuple[str, ...], batch_host: str | None) -> None:  # fmt: skip
        self.record, self.clock, self.guard = ctx.record, ctx.clock, ctx.guard
        self.judge, self.channel, self.slurm, self.start_probe = judge, channel, slurm, start_probe
        self.nodes, self.batch_host = nodes, batch_host
        self.probes: dict[str, Probe] = {}
        self.lost: set[str] = set()
        self.pending: tuple[str, ...] = ()
        self._not_responding: set[str] = set()
        self._next_slurm = 0.0

    @property
    def doubtful(self) -> set[str]:
        """The nodes quiet past the judge's threshold without a verdict yet, or being probed."""
        return (set(self.pending) | set(self.probes)) - self.lost

    @property
    def undecided(self) -> bool:
        """Some node is quiet without a verdict yet (or its probe runs): hang detections must wait."""
        return bool(self.pending or self.probes)

    def observe(self, ranks: Iterable[Any] | None = None) -> list[DetectionEvent]:
        """One pass; returns a ``node_lost`` detection per node newly found lost. ``ranks``: the table's rank
        views (default: the table's own snapshot)."""
        now = time.monotonic()
        views = self.channel.table.node_views()
        staleness = {n: views[n].staleness_s for n in self.nodes if n in views and n not in self.lost}
        ages: dict[str, list[float | None]] = {n: [] for n in staleness}
        for r in ranks if ranks is not None else self.channel.table.snapshot().ranks:
            if r.node in ages:
                ages[r.node].append(r.beat_age_s)
        suspects = [n for n, age in staleness.items() if age > self.judge.quiet_s and n != self.batch_host]
        if suspects and now >= self._next_slurm:
            self._next_slurm = now + SLURM_CHECK_S
            self._not_responding = self.guard.call(SLURM_QUERY, self._slurm_down, suspects, default=set())
        judgement = self.judge.judge(now, staleness, ages, batch_host=self.batch_host,
                                     not_responding=self._not_responding)  # fmt: skip
        verdicts = list(judgement.verdicts)
        for node in judgement.to_probe:
            self.probes[node] = self.start_probe(node, self.judge.config.probe_timeout_s)
        for node, probe in list(self.probes.items()):
            result = probe.result(now)
            if result is None and node in self.judge.state.probing:
                continue
            probe.stop()
            del self.probes[node]
            if result is not None:
                quiet = nl.ranks_silent(ages.get(node, ()), self.judge.timeout_s)
                verdict = self.judge.probe_result(node, result[0], now, staleness.get(node, 0.0), result[1], quiet)
                if verdict is not None:
                    verdicts.append(verdict)
        self.pending = judgement.pending
        found = []
        for verdict in verdicts:
            self.record(verdict.to_event(self.clock()))
            if verdict.verdict == nl.LOST:
                self.lost.update(verdict.nodes)
                found.append(of_silence(NODE_LOST, (), verdict.nodes, "summary_age_s", verdict.silent_s,
                                        verdict.timeout_s, verdict.evidence))  # fmt: skip
        return found

    def _slurm_down(self, nodes: list[str]) -> set[str]:
        try:
            return {n.name for n in self.slurm.nodes(nodes) if n.is_down}
        except SlurmError:
            return set()

    def close(self) -> None:
        for probe in self.probes.values():
            probe.stop()
        self.probes.clear()

"""Stragglers: a rank persistently slower than its peers (warning: an L2 alert and a strike on its node).

One slow rank sets the pace of every synchronous step, so a 1.5x straggler costs the whole job a third of its
throughput. Which time to compare: in synchronous data parallelism every rank's step period is the slowest one's
(the others wait for it in the gradient all-reduce), so periods cannot name it. Ranks that measure their own
time per step (``client.watch_ddp`` / ``client.waiting``: the step time less the time spent waiting for peers in
collectives; ``own_s``) are compared on that; when not every rank measures it, the step-period EWMAs are
compared instead (they do differ in programs whose ranks do not wait for each other).

A rank is a straggler when its time exceeds ``factor`` x the median of its peers' at ``consecutive`` evaluations
in a row, evaluations being at least ``interval_s`` apart: a single slow step (GC, a checkpoint on one rank)
never fires, and the median ignores a minority of slow peers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from supervisor.decisions.detect.findings import (
    STRAGGLER,
    DetectionEvent,
    LaunchView,
    RankView,
    of_rank,
    proc_meaning,
)


@dataclass(frozen=True)
class StragglerConfig:
    factor: float = 1.5
    consecutive: int = 6
    interval_s: float = 5.0
    min_ranks: int = 3  # with fewer ranks "slower than the peers" means little
    max_beat_age_s: float = 30.0  # a silent rank is a hang candidate, not a straggler

    def __post_init__(self) -> None:
        if not (math.isfinite(self.factor) and self.factor > 1.0):
            raise ValueError(f"detect.straggler_factor must be > 1, got {self.factor!r} (try 1.5)")
        if self.consecutive < 1:
            raise ValueError(f"detect.straggler_consecutive must be >= 1, got {self.consecutive!r}")
        if self.min_ranks < 2:
            raise ValueError(f"detect.straggler_min_ranks must be >= 2, got {self.min_ranks!r}")
        if not (math.isfinite(self.interval_s) and self.interval_s >= 0):
            raise ValueError(f"detect.straggler_interval_s must be >= 0, got {self.interval_s!r}")


@dataclass
class StragglerState:
    streaks: dict[int, int] = field(default_factory=dict)
    last_eval_t: float | None = None
    metric: str = ""  # what the streaks count ("own_ewma_s" or "iter_ewma_s"): a switch starts them over


OWN, PERIOD = "own_ewma_s", "iter_ewma_s"


def _positive(x: float | None) -> bool:
    return x is not None and math.isfinite(x) and x > 0


def compared(views: list[RankView]) -> tuple[str, list[tuple[RankView, float]]]:
    """The metric and each rank's value: own time when every rank measures it, else the step-period EWMA."""
    if views and all(_positive(v.own_s) for v in views):
        return OWN, [(v, v.own_s) for v in views if v.own_s is not None]
    return PERIOD, [(v, v.ewma_s) for v in views if v.ewma_s is not None and _positive(v.ewma_s)]


def median_without(sorted_values: list[float], value: float) -> float:
    """Median of ``sorted_values`` with one occurrence of ``value`` removed, in O(log n)."""
    import bisect

    n = len(sorted_values) - 1
    removed = bisect.bisect_left(sorted_values, value)

    def at(i: int) -> float:  # i-th element of the list without the removed one
        return sorted_values[i if i < removed else i + 1]

    if n % 2:
        return at(n // 2)
    return 0.5 * (at(n // 2 - 1) + at(n // 2))


class StragglerDetector:
    def __init__(self, config: StragglerConfig | None = None, state: StragglerState | None = None) -> None:
        self.config = config or StragglerConfig()
        self.state = state or StragglerState()

    def observe(self, snapshot: LaunchView, now: float) -> list[DetectionEvent]:
        c = self.config
        if self.state.last_eval_t is not None and now - self.state.last_eval_t < c.interval_s:
            return []
        self.state.last_eval_t = now
        alive = [
            v
            for v in snapshot.ranks()
            if v.phase == "step"
            and v.beat_age_s is not None
            and v.beat_age_s <= c.max_beat_age_s
            and proc_meaning(v.state) == "alive"
        ]
        metric, values = compared(alive)
        if metric != self.state.metric:
            self.state.streaks, self.state.metric = {}, metric
        if len(values) < c.min_ranks:
            self.state.streaks = {}
            return []
        ordered = sorted(x for _, x in values)
        events = []
        streaks: dict[int, int] = {}
        for v, x in values:
            peers = median_without(ordered, x)
            if x > c.factor * peers:
                streaks[v.rank] = self.state.streaks.get(v.rank, 0) + 1
                if streaks[v.rank] == c.consecutive:
                    events.append(self._event(v, x, peers, metric))
        self.state.streaks = streaks
        return events

    def _event(self, v: RankView, x: float, peers: float, metric: str) -> DetectionEvent:
        c = self.config
        what = "own time per step (collective waits excluded)" if metric == OWN else "time per iteration"
        period = f"; step period {v.ewma_s:.3g}s" if metric == OWN and v.ewma_s else ""
        return of_rank(STRAGGLER, v, metric, x, f"rank {v.rank} on {v.node}: {what} {x:.3g}s vs peers' median "
                       f"{peers:.3g}s ({x / peers:.2f}x) at {c.consecutive} checks in a row{period}",
                       threshold=c.factor * peers, duration_s=(c.consecutive - 1) * c.interval_s)  # fmt: skip

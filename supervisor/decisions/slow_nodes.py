"""Which nodes the preflight leaves out for being slow: only for a difference that persists and that matters. Pure.

Why: a single ratio on a single measurement took loopback noise for a slow node on a loaded machine ("latency 1353
us vs 366 us on its peers (> 2x)"), used up the only spare, and a real crash minutes later then had nowhere to
go. So three tests, each of which a noisy figure fails:

1. **Persistent.** The workers measure in rounds (``health/preflight_worker.py``): every node in the same round
   shares that moment's load. A node is slower in a round when its figure is beyond ``factor`` times the median
   of the others' in that round *and* beyond an absolute floor (differences of a few hundred microseconds are
   noise on a loaded machine); it is slow only when that holds in at least ``PERSISTENT`` (3/4) of the rounds: a
   slow node is slow in every round, while a loaded 2-core machine's scheduling noise once held for 3 of 5
   (bench/bench_preflight_noise.py).
2. **It matters.** What keeping it would cost: the training's slowdown (a synchronous step waits for its slowest
   rank) times ``horizon_s``, the time until the next chance to swap it out anyway. Compute: the ratio less one.
   Latency: the extra time per message times ``messages_per_s`` latency-bound messages per second of training.
   Bandwidth: the ratio less one, times ``comm_share`` of the step spent moving data.
3. **Worth what leaving it out costs.** With a spare to take its place: the spare is gone for the next node loss
   (``spare_share`` of the horizon). Without one: the launch cannot go ahead on the nodes here (a requeue,
   ``requeue_cost_s``). The slowest nodes take the spares first.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

COMPUTE = "compute"
LATENCY = "latency"
BANDWIDTH = "bandwidth"
METRICS = (COMPUTE, LATENCY, BANDWIDTH)
FLOORS = {COMPUTE: 2e-3, LATENCY: 200e-6, BANDWIDTH: 0.0}  # excess (s) below which a difference is noise
MIN_PEERS = {COMPUTE: 1, LATENCY: 2, BANDWIDTH: 2}  # others to compare with (a ping-pong's two ends: 2 others)
PERSISTENT = 0.75  # the share of rounds a node must be slower in


@dataclass(frozen=True)
class Costs:
    """``[preflight]`` settings of the cost model (docs/configuration.md)."""

    horizon_s: float = 3600.0  # how long a kept slow node slows the training before it can be swapped out anyway
    requeue_cost_s: float = 600.0  # leaving a node out with no spare to replace it: a requeue (queue, restart)
    spare_share: float = 0.05  # a spare taken now, as a share of the horizon (the next node loss costs a requeue)
    messages_per_s: float = 100.0  # latency-bound messages per second of training (per-layer collectives)
    comm_share: float = 0.3  # share of a step spent moving data at full bandwidth


DEFAULT_COSTS = Costs()


@dataclass(frozen=True)
class Slower:
    """A node slower than its peers in (at least ``PERSISTENT`` of) the rounds, by one metric."""

    node: str
    metric: str
    value: float  # the node's median over rounds
    ref: float  # the median over rounds of its peers' per-round median
    rounds: int  # rounds in which it was beyond the factor and the floor
    of: int  # rounds measured
    slowdown: float  # the training's estimated slowdown if it is kept (a fraction)

    def describe(self) -> str:
        if self.metric == BANDWIDTH:
            figure = f"bandwidth {self.value / 1e6:.0f} MB/s vs {self.ref / 1e6:.0f} MB/s on its peers"
        elif self.metric == LATENCY:
            figure = f"latency {self.value * 1e6:.0f} us vs {self.ref * 1e6:.0f} us on its peers"
        else:
            figure = f"compute {self.value * 1e3:.1f} ms vs {self.ref * 1e3:.1f} ms on its peers"
        return f"{figure} in {self.rounds} of {self.of} rounds: ~{self.slowdown:.0%} slower training"


def _per_round(series: Mapping[str, Sequence[float]], node: str, metric: str, factor: float
               ) -> tuple[int, int, list[float], list[float]]:  # fmt: skip
    """(rounds beyond, rounds compared, per-round ratio, per-round excess) of ``node`` against its peers."""
    mine = series[node]
    beyond = compared = 0
    ratios, excesses = [], []
    for r, value in enumerate(mine):
        others = [v[r] for n, v in series.items() if n != node and r < len(v)]
        if len(others) < MIN_PEERS[metric] or value <= 0:
            continue
        ref = statistics.median(others)
        if ref <= 0:
            continue
        compared += 1
        ratio = ref / value if metric == BANDWIDTH else value / ref
        excess = value - ref if metric != BANDWIDTH else 0.0
        ratios.append(ratio)
        excesses.append(excess)
        if ratio > factor and excess >= FLOORS[metric]:
            beyond += 1
    return beyond, compared, ratios, excesses


def slower_nodes(figures: Mapping[str, Mapping[str, Sequence[float]]], factor: float,
                 costs: Costs = DEFAULT_COSTS) -> list[Slower]:  # fmt: skip
    """``figures``: node -> metric -> its per-round values (round r of every node measured at the same time).
    The nodes slower than their peers in at least ``PERSISTENT`` of the rounds, one entry per node and metric,
    slowest first."""
    found = []
    for metric in METRICS:
        series = {n: list(f[metric]) for n, f in figures.items() if f.get(metric)}
        for node in series:
            beyond, compared, ratios, excesses = _per_round(series, node, metric, factor)
            if compared == 0 or beyond < PERSISTENT * compared:
                continue
            ratio = statistics.median(ratios)
            if metric == COMPUTE:
                slowdown = ratio - 1.0
            elif metric == LATENCY:
                slowdown = statistics.median(excesses) * costs.messages_per_s
            else:
                slowdown = (ratio - 1.0) * costs.comm_share
            refs = [statistics.median([v[r] for n, v in series.items() if n != node and r < len(v)])
                    for r in range(len(series[node])) if any(r < len(v) for n, v in series.items() if n != node)]
            found.append(Slower(node, metric, statistics.median(series[node]), statistics.median(refs), beyond,
                                compared, round(max(0.0, slowdown), 4)))  # fmt: skip
    return sorted(found, key=lambda s: (-s.slowdown, s.node, s.metric))


def leave_out(slower: Sequence[Slower], spares: int, costs: Costs = DEFAULT_COSTS) -> tuple[dict[str, str], dict[str, str]]:
    """(left out, kept): node -> why. A node is left out when what its slowness would cost over the horizon is
    more than what leaving it out costs: a spare (``spares`` of them, given to the slowest first), else a
    requeue. ``spares`` < 0 counts as none."""
    worst: dict[str, Slower] = {}
    for s in slower:
        if s.node not in worst or s.slowdown > worst[s.node].slowdown:
            worst[s.node] = s
    out: dict[str, str] = {}
    kept: dict[str, str] = {}
    for i, s in enumerate(sorted(worst.values(), key=lambda s: (-s.slowdown, s.node))):
        keep_cost = s.slowdown * costs.horizon_s
        if i < max(0, spares):
            out_cost, instead = costs.spare_share * costs.horizon_s, "the spare it takes"
        else:
            out_cost, instead = costs.requeue_cost_s, "a requeue (no spare left)"
        verdict = f"{s.describe()}, {keep_cost:.0f} s over the {costs.horizon_s:.0f} s horizon"
        if keep_cost > out_cost:
            out[s.node] = f"{verdict} > {instead} ({out_cost:.0f} s)"
        else:
            kept[s.node] = f"{verdict} <= {instead} ({out_cost:.0f} s): kept"
    return out, kept

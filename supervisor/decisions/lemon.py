"""Lemon nodes: a node that fails far more often than the fleet, judged across campaigns and users (issue 24).

One campaign's ledger sees a node fail once or twice and cannot tell bad luck from a bad machine; the site sees
every campaign. Kokolis et al. (HPCA 2025, 4 M jobs on two research clusters) found that detecting such "lemon"
nodes across jobs was one of the two mitigations that mattered. The rule here is a stated test, not a threshold:

* The fleet's failure rate per node-hour, over a sliding window, **without the node under test** (a very bad
  node must not raise the bar it is judged against): ``rate = (K - k) / (E - e)``.
* The node's failures ``k`` over its exposure ``e`` (node-hours in jobs, in the same window) are compared with a
  Poisson count of mean ``rate * e``: ``p = P(X >= k)``. The node is a lemon when ``p`` is below ``alpha`` divided
  by the number of nodes judged (Bonferroni: with a thousand nodes, one in a thousand healthy nodes would
  otherwise be named by chance at every look), with at least ``min_failures`` failures.
* Failures count only from jobs of at least ``min_users`` users (two, as the issue's trust rule says: one user's
  program that crashes on every node it touches must not take a node away from everyone), and in at least two jobs.
* A node whose exposure is unknown is not judged (decide on complete evidence; "unknown", never "healthy" or
  "lemon"); the fleet rate needs at least ``min_fleet_hours`` of exposure elsewhere.

Pure: the site service passes the failures and exposures it recorded; nothing here reads a clock or a database.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeFailure:
    """One interruption blamed on ``node`` (hardware, node loss, hang... any class the site counts)."""

    node: str
    t: float  # epoch seconds
    klass: str
    user: str
    job: str


@dataclass(frozen=True)
class LemonConfig:
    window_s: float = 30 * 86400.0
    alpha: float = 0.01  # the fleet-wide chance of naming a healthy node in one look (before Bonferroni)
    min_failures: int = 3
    min_users: int = 2
    min_fleet_hours: float = 24.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"site.lemon_window_s must be a positive number of seconds, got {self.window_s!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"site.lemon_alpha must be between 0 and 1, got {self.alpha!r} (try 0.01)")
        if self.min_failures < 1 or self.min_users < 1:
            raise ValueError("site.lemon_min_failures and site.lemon_min_users must be >= 1")
        if not (math.isfinite(self.min_fleet_hours) and self.min_fleet_hours >= 0):
            raise ValueError(f"site.lemon_min_fleet_hours must be >= 0, got {self.min_fleet_hours!r}")


@dataclass(frozen=True)
class LemonScore:
    node: str
    failures: int  # in the window
    users: int  # distinct users whose jobs saw them
    jobs: int
    exposure_h: float | None  # None: unknown (not judged)
    expected: float | None  # the fleet's rate times this node's exposure
    p_value: float | None  # P(X >= failures) under the fleet's rate; None: not judged
    lemon: bool
    why: str


def poisson_sf(k: int, mu: float) -> float:
    """P(X >= k) for X ~ Poisson(mu), accurate in the far tail (where a lemon's p-value lies)."""
    if k <= 0:
        return 1.0
    if mu <= 0:
        return 0.0
    log_mu = math.log(mu)
    if k <= mu:  # the tail is large: one minus the (short) head
        head = sum(math.exp(j * log_mu - mu - math.lgamma(j + 1)) for j in range(k))
        return min(1.0, max(0.0, 1.0 - head))
    term = math.exp(k * log_mu - mu - math.lgamma(k + 1))  # terms fall from here on (k > mu)
    total, j = term, k
    while term > total * 1e-17 and j < k + 100_000:
        j += 1
        term *= mu / j
        total += term
    return min(1.0, total)


def score_nodes(failures: Iterable[NodeFailure], exposure_h: Mapping[str, float | None], now: float,
                config: LemonConfig | None = None) -> list[LemonScore]:  # fmt: skip
    """A score for every node in ``exposure_h`` (node-hours in jobs during the window; None: unknown) and every
    node with a failure in the window, sorted by p-value (most suspect first; unjudged last)."""
    c = config or LemonConfig()
    since = now - c.window_s
    recent = [f for f in failures if since <= f.t <= now]
    nodes = sorted(set(exposure_h) | {f.node for f in recent})
    by_node: dict[str, list[NodeFailure]] = {n: [] for n in nodes}
    for f in recent:
        by_node[f.node].append(f)
    known = {n: e for n, e in exposure_h.items() if e is not None and math.isfinite(e) and e >= 0}
    total_k = sum(len(by_node[n]) for n in known)
    total_e = sum(known.values())
    judged = max(1, len(known))
    bar = c.alpha / judged
    scores = []
    for node in nodes:
        seen = by_node[node]
        users, jobs = len({f.user for f in seen}), len({f.job for f in seen})
        e = known.get(node)
        if e is None:
            scores.append(LemonScore(node, len(seen), users, jobs, None, None, None, False,
                                     "exposure unknown: not judged"))  # fmt: skip
            continue
        rest_e, rest_k = total_e - e, total_k - len(seen)
        if rest_e < c.min_fleet_hours:
            scores.append(LemonScore(node, len(seen), users, jobs, e, None, None, False,
                                     f"the rest of the fleet has {rest_e:.1f} node-hours in the window (< "
                                     f"{c.min_fleet_hours:g}): no rate to judge against"))  # fmt: skip
            continue
        expected = rest_k / rest_e * e
        p = poisson_sf(len(seen), expected)
        counted = len(seen) >= c.min_failures and users >= c.min_users and jobs >= 2
        lemon = counted and p < bar
        why = (f"{len(seen)} failures in {e:.1f} node-hours (jobs of {users} users, {jobs} jobs) vs {expected:.3g} "
               f"expected at the fleet's rate: p = {p:.3g} (bar {bar:.3g} = {c.alpha:g} / {judged} nodes)")
        if not counted:
            why += (f"; not counted: needs >= {c.min_failures} failures in >= 2 jobs of >= {c.min_users} users")
        scores.append(LemonScore(node, len(seen), users, jobs, e, expected, p, lemon, why))
    return sorted(scores, key=lambda s: (s.p_value is None, s.p_value if s.p_value is not None else 1.0, s.node))

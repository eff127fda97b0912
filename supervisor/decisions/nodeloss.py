"""Our own verdict on a lost node, long before Slurm's SlurmdTimeout. Pure: no clock, no I/O.

A node is *silent* when its agent and every rank on it have been quiet past a timeout learned from the beat
interval (the agents' summary interval, or the widest gap actually seen between two summaries of a healthy
node, whichever is larger, times ``beats_missed``; bounded by ``floor_s`` and ``cap_s``, default at most 5 s).
A silent node is *lost* once a cheap probe confirms it (``slurm/probe.py``: a short ``srun --overlap -w NODE
true``), or at once when Slurm already flags it NOT_RESPONDING/DOWN. The probe starts as soon as the node is
``quiet_beats`` late, so it runs while the timeout does: the verdict comes at max(timeout, quiet + probe time)
rather than their sum. A probe that gets through clears the node: it is alive, only its agent is quiet (the
agents' step restarts it), and it is probed again only after ``reprobe_s``.

Two rules keep the blame honest:
- every watched node silent at once is *our* side (the supervisor's network, the agents' step): nobody is
  blamed (verdict ``ours``), nothing is probed;
- the batch host is never declared lost by the supervisor running on it: its agent's silence is ours too.

While a node is quiet and not yet judged (:meth:`NodeLossJudge.pending`), the loop holds back hang detections:
a hang needs a live agent saying the process is there; a crashed node leaves its peers stopped in a collective,
and the dead node, not the hang, is the cause.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from supervisor.decisions import events as ev

LOST = "lost"  # silent and confirmed (probe failed, or Slurm says NOT_RESPONDING/DOWN)
ALIVE = "alive"  # silent, but the probe got through: the node lives, its agent is quiet
OURS = "ours"  # every watched node silent at once: the supervisor's side, nobody blamed
VERDICTS = (LOST, ALIVE, OURS)

BY_PROBE = "probe"
BY_SLURM = "not_responding"


@dataclass(frozen=True)
class NodeLossConfig:
    beats_missed: float = 3.0  # a node is suspect after this many beat intervals without a summary ...
    floor_s: float = 2.0  # ... but never sooner than this
    cap_s: float = 5.0  # ... and never later than this (the learned timeout is bounded)
    probe_timeout_s: float = 2.0  # the probe's srun gets this long; no answer counts as dead
    reprobe_s: float = 15.0  # a node the probe found alive is not probed again before this
    quiet_beats: float = 1.25  # a node this many beats late is "quiet": hang detections wait for its verdict

    def __post_init__(self) -> None:
        for name in ("beats_missed", "floor_s", "cap_s", "probe_timeout_s", "reprobe_s", "quiet_beats"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"node loss: {name} must be a positive number, got {value!r}")
        if self.floor_s > self.cap_s:
            raise ValueError(f"node loss: floor_s ({self.floor_s}) must not exceed cap_s ({self.cap_s})")


@dataclass(frozen=True)
class NodeLossVerdict:
    """One judgement about one node (or, for ``ours``, about all of them)."""

    verdict: str  # LOST | ALIVE | OURS
    nodes: tuple[str, ...]
    silent_s: float  # how long the (longest) silence had lasted
    timeout_s: float  # the learned timeout it was judged against
    confirmed_by: str | None = None  # BY_PROBE | BY_SLURM for LOST; None otherwise
    detail: str = ""

    def to_event(self, t: float) -> ev.Event:
        return ev.node_loss_verdict(t, self.verdict, self.nodes, self.silent_s, self.timeout_s, self.confirmed_by,
                                    self.detail)  # fmt: skip

    @property
    def evidence(self) -> str:
        who = ", ".join(self.nodes)
        if self.verdict == LOST:
            how = "the probe failed" if self.confirmed_by == BY_PROBE else "Slurm flags it NOT_RESPONDING/DOWN"
            return (f"node {who} lost: its agent and ranks silent {self.silent_s:.1f}s > {self.timeout_s:.1f}s and "
                    f"{how}{': ' + self.detail if self.detail else ''}")  # fmt: skip
        if self.verdict == ALIVE:
            return f"node {who}: agent silent {self.silent_s:.1f}s but the probe got through: alive"
        return f"all {len(self.nodes)} node agents silent {self.silent_s:.1f}s: our side, no node blamed"


@dataclass
class NodeLossState:
    gaps: deque[float] = field(default_factory=lambda: deque(maxlen=64))  # widest silences seen before a summary
    last_staleness: dict[str, float] = field(default_factory=dict)
    probing: dict[str, float] = field(default_factory=dict)  # node -> when its probe started
    cleared: dict[str, float] = field(default_factory=dict)  # node -> when a probe last found it alive
    failed: dict[str, str] = field(default_factory=dict)  # node -> why its probe failed (before it was silent)
    lost: set[str] = field(default_factory=set)
    ours_since: float | None = None  # "everyone silent" was reported (once per episode)


@dataclass(frozen=True)
class Judgement:
    """What one pass found: probes to start, verdicts reached, and whether hang detections must wait."""

    to_probe: tuple[str, ...] = ()
    verdicts: tuple[NodeLossVerdict, ...] = ()
    pending: tuple[str, ...] = ()  # quiet nodes without a verdict yet: hangs wait for them


class NodeLossJudge:
    def __init__(self, config: NodeLossConfig | None = None, beat_interval_s: float = 1.0,
                 state: NodeLossState | None = None) -> None:  # fmt: skip
        self.config = config or NodeLossConfig()
        self.beat_interval_s = beat_interval_s
        self.state = state or NodeLossState()

    # --------------------------------------------------------------------------------------------- learning
    @property
    def beat_s(self) -> float:
        """The beat interval we judge by: the configured one, or the widest recent gap if larger."""
        return max([self.beat_interval_s, *self.state.gaps])

    @property
    def timeout_s(self) -> float:
        c = self.config
        return min(c.cap_s, max(c.floor_s, c.beats_missed * self.beat_s))

    @property
    def quiet_s(self) -> float:
        return min(self.timeout_s, max(1.0, self.config.quiet_beats * self.beat_s))

    def learn(self, staleness: Mapping[str, float]) -> None:
        """Feed each node's staleness (seconds since its agent's last summary) as seen at one pass: when it
        drops, a summary arrived, and the staleness just before was (about) the gap between two summaries.
        Gaps of nodes that went on to be suspect are not learned from (a crash is not a slow beat)."""
        s = self.state
        for node, age in staleness.items():
            before = s.last_staleness.get(node)
            if before is not None and age < before and before < self.timeout_s and node not in s.lost:
                s.gaps.append(before)
            s.last_staleness[node] = age

    # --------------------------------------------------------------------------------------------- judging
    def judge(
        self,
        now: float,
        staleness: Mapping[str, float],
        rank_ages: Mapping[str, Iterable[float | None]],
        *,
        batch_host: str | None = None,
        not_responding: Iterable[str] = (),
    ) -> Judgement:
        """One pass over the watched nodes. ``staleness``: node -> seconds since its agent's last summary
        (``inf`` if never heard); ``rank_ages``: node -> its ranks' beat ages (None: the rank has no client);
        ``not_responding``: nodes Slurm flags NOT_RESPONDING/DOWN (when known)."""
        self.learn({n: a for n, a in staleness.items() if math.isfinite(a)})
        timeout = self.timeout_s
        s = self.state
        watched = [n for n in staleness if n not in s.lost]
        silent = {n for n in watched if staleness[n] > timeout and ranks_silent(rank_ages.get(n, ()), timeout)}
        verdicts: list[NodeLossVerdict] = []
        if len(watched) > 0 and silent == set(watched):  # everyone at once: our link, not their nodes
            s.probing.clear()
            if s.ours_since is None:
                s.ours_since = now
                verdicts.append(NodeLossVerdict(OURS, tuple(sorted(watched)), min(staleness[n] for n in watched), timeout))
            return Judgement(verdicts=tuple(verdicts))
        s.ours_since = None
        bad = set(not_responding)
        quiet = {n for n in watched if staleness[n] > self.quiet_s and n != batch_host}
        to_probe = []
        for node in sorted(quiet):
            if node in silent and node in bad:
                s.probing.pop(node, None)
                verdicts.append(self._lost(node, staleness[node], BY_SLURM))
            elif node in silent and node in s.failed:
                verdicts.append(self._lost(node, staleness[node], BY_PROBE, s.failed.pop(node)))
            elif node not in s.probing and node not in s.failed and \
                    now - s.cleared.get(node, -math.inf) >= self.config.reprobe_s:  # fmt: skip
                s.probing[node] = now
                to_probe.append(node)
        for table in (s.probing, s.failed, s.cleared):
            for node in [n for n in table if n not in quiet]:
                del table[node]  # it spoke again: a later silence is judged afresh
        pending = sorted(n for n in quiet if n not in s.cleared and n not in s.lost)  # quiet, no verdict yet
        return Judgement(tuple(to_probe), tuple(verdicts), tuple(pending))

    def probe_result(self, node: str, alive: bool, now: float, silent_s: float, detail: str = "",
                     ranks_silent: bool = True) -> NodeLossVerdict | None:  # fmt: skip
        """The probe of ``node`` answered. None when the node is no longer being probed (it spoke again), or
        when the probe failed before the node was silent past the timeout (the verdict then waits for it)."""
        if self.state.probing.pop(node, None) is None:
            return None
        if alive:
            self.state.cleared[node] = now
            return NodeLossVerdict(ALIVE, (node,), silent_s, self.timeout_s, None, detail)
        if silent_s > self.timeout_s and ranks_silent:
            return self._lost(node, silent_s, BY_PROBE, detail)
        self.state.failed[node] = detail
        return None

    def _lost(self, node: str, silent_s: float, by: str, detail: str = "") -> NodeLossVerdict:
        self.state.lost.add(node)
        return NodeLossVerdict(LOST, (node,), silent_s, self.timeout_s, by, detail)

    def forget(self, node: str) -> None:
        """The node is out of the watch (excluded, or the allocation changed)."""
        s = self.state
        for table in (s.last_staleness, s.probing, s.cleared, s.failed):
            table.pop(node, None)


def ranks_silent(ages: Iterable[float | None], timeout: float) -> bool:
    """Every rank on the node silent past the timeout (a rank without a client says nothing either way)."""
    return all(age is None or age > timeout for age in ages)

"""Hang detection: one rank silent, a whole node silent, or everyone stalled.

The detector also learns the timeouts it applies: it watches each rank's step counter and phase between
snapshots and feeds iteration times and phase durations into :class:`PhaseTimeouts`. A rank is keyed by
(rank, pid), so a relaunched step starts fresh while the learned timeouts carry over.

Why "laggards": in data-parallel training one stuck rank soon stalls everyone (the others wait in the next
collective), so "all silent" is the usual picture of a single-rank hang. The ranks still on an older step
than the rest, or in stopped state, are the likely culprits and are named; only when none stands out is it a
``global_stall``.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from supervisor.client.layout import RANK_FLAG_EXITING
from supervisor.decisions.detect.findings import (
    GLOBAL_STALL,
    NODE_SILENT,
    RANK_EXITED,
    RANK_HANG,
    RANK_STOPPED,
    DetectionEvent,
    LaunchView,
    RankView,
    of_rank,
    of_silence,
    proc_meaning,
)
from supervisor.decisions.detect.timeouts import STEP, PhaseTimeouts, TimeoutConfig


@dataclass(frozen=True)
class HangConfig:
    node_silence_s: float = 10.0  # no node-agent summary for this long: node_silent
    node_stale_s: float = 3.0  # a node's summary this old: its ranks' beat ages are not current, judge them not
    stopped_grace_s: float = 2.0  # a rank in stopped state this long counts as hung (a debugger blip does not)
    # Ranks finishing: once a peer has exited normally (exit 0, or its interpreter's atexit ran) the ranks on
    # the same or a newer step, and a rank whose own atexit ran, get this long to exit (barrier, teardown).
    finish_allowance_s: float = 120.0

    def __post_init__(self) -> None:
        for name in ("node_silence_s", "node_stale_s", "stopped_grace_s", "finish_allowance_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"detect.{name} must be a non-negative number of seconds, got {value!r}")
        if self.node_stale_s > self.node_silence_s:
            raise ValueError(
                f"detect.node_stale_s ({self.node_stale_s}) must not exceed detect.node_silence_s "
                f"({self.node_silence_s})"
            )


@dataclass
class RankTrack:
    """What the detector remembers about one rank process between snapshots."""

    step: int | None
    step_seen_t: float  # when the rank beat for the current step (now - beat age), else when first seen
    first_step: int | None  # the step the process reported first (a resumed run does not start at 0)
    phase: str | None
    phase_seen_t: float
    stopped_since: float | None = None


@dataclass
class HangState:
    tracks: dict[tuple[int, int | None], RankTrack] = field(default_factory=dict)
    active: set[tuple[str, str]] = field(default_factory=set)  # conditions already reported (kind, key)


class _WaitAllowance:
    """The timeout that judges a step-phase rank: its own, or a busy peer's allowance while it waits for that peer.

    Ranks waiting for a peer's long phase (rank 0 saving a checkpoint while the others sit in a barrier) are
    silent in the step phase: while some rank is busy in a longer phase within its allowance, a step-phase rank
    on the *same or a newer* step gets that allowance too. The rank that is *behind* (an older step than the
    busy ranks) is what they are waiting for, never the other way round: it is judged by its own phase's
    timeout, so a rank that hangs right before a collective checkpoint is caught within the step timeout while
    its peers, waiting inside the checkpoint, are not called hung. O(n log n) for n ranks.
    """

    def __init__(self, beating: list[tuple[RankView, RankTrack]], limits: list[float]) -> None:
        busy = [(v.step, lim) for (v, _), lim in zip(beating, limits, strict=True)
                if v.phase != STEP and v.beat_age_s is not None and v.beat_age_s <= lim]  # fmt: skip
        self.any_busy = max((lim for _, lim in busy), default=0.0)
        self.stepless = max((lim for step, lim in busy if step is None), default=0.0)
        known = sorted((step, lim) for step, lim in busy if step is not None)
        self.steps = [step for step, _ in known]
        self.best_upto: list[float] = []  # best_upto[i]: the largest allowance among known[0..i]
        for _, lim in known:
            self.best_upto.append(max(lim, self.best_upto[-1] if self.best_upto else 0.0))

    def limit(self, view: RankView, own: float) -> float:
        if view.phase != STEP:
            return own
        if view.step is None:
            return max(own, self.any_busy)
        at_or_before = bisect.bisect_right(self.steps, view.step)  # busy peers not ahead of this rank
        waited = self.best_upto[at_or_before - 1] if at_or_before else 0.0
        return max(own, waited, self.stepless)


def finished_normally(view: RankView) -> bool:
    """A rank process that is gone after a normal exit: code 0, or its interpreter's atexit ran (the client's
    exiting flag; the agent often cannot know the code of a process it did not start)."""
    if proc_meaning(view.state) != "gone":
        return False
    return view.exit_status == 0 or (view.exit_status is None and bool(view.rank_flags & RANK_FLAG_EXITING))


def finishing(view: RankView, finished_steps: list[int | None]) -> bool:
    """Whether a silent rank is on its way out: its own atexit ran, or a peer finished normally and this rank
    has done at least the peer's work (a rank behind a finished peer is not finishing, it is late)."""
    if view.rank_flags & RANK_FLAG_EXITING:
        return True
    return any(s is None or view.step is None or view.step >= s for s in finished_steps)


@dataclass(frozen=True)
class Overdue:
    """A rank past its own phase's timeout (whether or not a busy peer's allowance still covers it)."""

    node: str
    age_s: float
    own_limit_s: float
    phase: str | None
    step: int | None


class HangDetector:
    def __init__(
        self,
        config: HangConfig | None = None,
        timeouts: PhaseTimeouts | None = None,
        state: HangState | None = None,
    ) -> None:
        self.config = config or HangConfig()
        self.timeouts = timeouts or PhaseTimeouts(TimeoutConfig())
        self.state = state or HangState()
        # Ranks past their own phase's timeout at the last observe: the stall probe asks for their stacks, so
        # the rank the others wait for is named within its own timeout (decisions/stall.py).
        self.overdue: dict[int, Overdue] = {}

    def _learn(self, view: RankView, now: float) -> RankTrack:
        key = (view.rank, view.pid)
        beat_t = now - view.beat_age_s if view.beat_age_s is not None else now
        track = self.state.tracks.get(key)
        if track is None:
            track = RankTrack(view.step, beat_t, view.step, view.phase, now)
            self.state.tracks[key] = track
            return track
        if view.step is not None and track.step is not None and view.step > track.step:
            # Beat times (now - beat age) are exact, so a sample is the true mean time per step between the
            # two beats, free of snapshot jitter. (The client's recent max would repeat one outlier for
            # ~100 steps and pin p99 to it.)
            if track.phase == STEP and view.phase == STEP and track.step != track.first_step:
                self.timeouts.observe(STEP, max(0.0, beat_t - track.step_seen_t) / (view.step - track.step))
            track.step, track.step_seen_t = view.step, beat_t
        elif view.step is not None and track.step is None:
            track.step, track.step_seen_t, track.first_step = view.step, beat_t, view.step
        if view.phase != track.phase:
            if track.phase not in (None, STEP, "init"):
                self.timeouts.observe(track.phase, now - track.phase_seen_t)
            track.phase, track.phase_seen_t = view.phase, now
        return track

    def reset(self) -> None:
        """Forget rank processes (call when a new training step is launched); learned timeouts persist."""
        self.state = HangState()
        self.overdue = {}

    def observe(self, snapshot: LaunchView, now: float) -> list[DetectionEvent]:
        events: list[DetectionEvent] = []
        current: set[tuple[str, str]] = set()
        silent_nodes = [n for n in snapshot.nodes if n.staleness_s > self.config.node_silence_s]
        if silent_nodes and len(snapshot.nodes) > 1 and all(n.staleness_s > self.config.node_stale_s
                                                            for n in snapshot.nodes):  # fmt: skip
            # Every agent went quiet together (their summaries are staggered by up to one interval, so one crosses
            # the silence threshold first): report them as one, so "everyone silent" (our side: the supervisor's
            # network, the agents' step) is seen, instead of the first node alone being taken for a dead node.
            silent_nodes = list(snapshot.nodes)
        for node in silent_nodes:
            key = (NODE_SILENT, node.node)
            current.add(key)
            if key not in self.state.active:
                events.append(of_silence(
                    NODE_SILENT, (r.rank for r in node.ranks), (node.node,), "summary_age_s", node.staleness_s,
                    self.config.node_silence_s, f"no summary from the node agent on {node.node} for {node.staleness_s:.1f}s",
                ))  # fmt: skip
        stale_names = {n.node for n in snapshot.nodes if n.staleness_s > self.config.node_stale_s}
        beating: list[tuple[RankView, RankTrack]] = []
        hung: list[tuple[RankView, float, float]] = []  # (view, age, timeout)
        for view in snapshot.ranks():
            if view.node in stale_names:
                continue  # its data is not current (and if it stays so, node_silent covers it)
            track = self._learn(view, now)
            meaning = proc_meaning(view.state)
            if meaning == "gone":
                key = (RANK_EXITED, str(view.rank))
                current.add(key)
                if key not in self.state.active:
                    code = "unknown" if view.exit_status is None else str(view.exit_status)
                    events.append(of_rank(RANK_EXITED, view, "exit_code", None if view.exit_status is None else
                                          float(view.exit_status), f"rank {view.rank} on {view.node} (pid "
                                          f"{view.pid}) exited, code {code}"))  # fmt: skip
                continue
            if meaning == "stopped":
                track.stopped_since = now if track.stopped_since is None else track.stopped_since
                stopped_for = now - track.stopped_since
                if stopped_for >= self.config.stopped_grace_s:
                    key = (RANK_STOPPED, str(view.rank))
                    current.add(key)
                    if key not in self.state.active:
                        events.append(of_silence(
                            RANK_STOPPED, (view.rank,), (view.node,), "stopped_s", stopped_for,
                            self.config.stopped_grace_s, f"rank {view.rank} on {view.node} (pid {view.pid}) is in "
                            f"stopped state ({view.state}) for {stopped_for:.1f}s",
                        ))  # fmt: skip
                continue
            track.stopped_since = None
            if view.beat_age_s is None:
                continue  # no client in this program: only liveness is supervised
            beating.append((view, track))
        limits = []
        for view, track in beating:
            first_done = track.step is not None and track.step != track.first_step
            limits.append(self.timeouts.timeout(view.phase, first_done))
        allowance = _WaitAllowance(beating, limits)
        finished = [v.step for v in snapshot.ranks() if finished_normally(v)]
        self.overdue = {}
        for (view, _), own in zip(beating, limits, strict=True):
            limit = allowance.limit(view, own)
            assert view.beat_age_s is not None
            if finishing(view, finished):
                limit = max(limit, self.config.finish_allowance_s)
            elif view.beat_age_s > own:
                self.overdue[view.rank] = Overdue(view.node, view.beat_age_s, own, view.phase, view.step)
            if view.beat_age_s > limit:
                hung.append((view, view.beat_age_s, limit))
        events.extend(self._hang_events(beating, hung, current))
        self.state.active = current
        return events

    def _hang_events(
        self,
        beating: list[tuple[RankView, RankTrack]],
        hung: list[tuple[RankView, float, float]],
        current: set[tuple[str, str]],
    ) -> list[DetectionEvent]:
        if not hung:
            return []
        everyone = len(hung) == len(beating) and len(beating) > 1
        steps = [v.step for v, _, _ in hung if v.step is not None]
        laggards = [h for h in hung if h[0].step is not None and steps and h[0].step < max(steps)]
        if everyone and not laggards:
            key = (GLOBAL_STALL, "*")
            current.add(key)
            if key in self.state.active:
                return []
            ages = [age for _, age, _ in hung]
            return [of_silence(
                GLOBAL_STALL, (v.rank for v, _, _ in hung), (v.node for v, _, _ in hung), "beat_age_s", min(ages),
                max(limit for _, _, limit in hung),
                f"all {len(hung)} ranks silent for {min(ages):.1f}s or more, all on step {steps[0] if steps else '?'}",
            )]  # fmt: skip
        culprits = laggards or hung
        new = [h for h in culprits if (RANK_HANG, str(h[0].rank)) not in self.state.active]
        for view, _, _ in culprits:
            current.add((RANK_HANG, str(view.rank)))
        if not new:
            return []
        worst = max(new, key=lambda h: h[1])
        evidence = tuple(
            f"rank {v.rank} on {v.node} silent {age:.1f}s > {limit:.1f}s ({v.phase} phase, step {v.step})"
            for v, age, limit in sorted(new, key=lambda h: h[0].rank)[:16]
        )
        if everyone:
            evidence += (f"all {len(hung)} ranks are silent; these lag behind step {max(steps)}",)
        return [of_silence(RANK_HANG, (v.rank for v, _, _ in new), (v.node for v, _, _ in new), "beat_age_s",
                           worst[1], worst[2], *evidence)]  # fmt: skip

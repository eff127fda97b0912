"""Loss anomalies: NaN/Inf (a fault: training cannot recover from it), spikes (a warning) and, when asked for
(``diverged_steps``), a spike the loss does not come back from (a fault, rolled back like a NaN).

A spike is a loss more than ``z`` standard deviations above the mean of the last ``window`` observed losses. It
is confirmed as a divergence when the next ``diverged_steps`` observed losses all stay above that same bar (0,
the default: never; a loss that moves to a new level for good, after a schedule change, would look the same).
Spikes are tracked on the first ``spike_ranks`` ranks only (rank 0 by default): with data parallelism the
ranks' losses move together, and a window per rank would cost memory proportional to the job size. NaN/Inf is
checked on every rank (O(1) each).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from supervisor.decisions.detect.findings import (
    LOSS_DIVERGED,
    LOSS_SPIKE,
    NONFINITE_LOSS,
    DetectionEvent,
    LaunchView,
    of_rank,
)


@dataclass(frozen=True)
class LossConfig:
    window: int = 100
    min_samples: int = 20
    z: float = 6.0
    spike_ranks: int = 1
    cooldown_steps: int = 100  # after a spike, stay quiet for this many steps on that rank
    relative_floor: float = 1e-3  # std never counts as below this fraction of |mean| (a flat loss is not noise-free)
    diverged_steps: int = 0  # a spike whose next N losses all stay above its bar is a divergence (0: never)

    def __post_init__(self) -> None:
        if self.window < 2:
            raise ValueError(f"detect.loss_window must be >= 2, got {self.window!r}")
        if not 2 <= self.min_samples <= self.window:
            raise ValueError(
                f"detect.loss_min_samples must be between 2 and loss_window ({self.window}), got {self.min_samples!r}"
            )
        if not (math.isfinite(self.z) and self.z > 0):
            raise ValueError(f"detect.loss_z must be a positive number, got {self.z!r} (try 6)")
        if self.spike_ranks < 0 or self.cooldown_steps < 0 or not self.relative_floor >= 0 or self.diverged_steps < 0:
            raise ValueError("detect.loss_spike_ranks, loss_cooldown_steps, loss_relative_floor and loss_diverged_steps "
                             "must be >= 0")


@dataclass
class LossState:
    last_step: dict[int, int] = field(default_factory=dict)
    windows: dict[int, deque[float]] = field(default_factory=dict)
    quiet_until: dict[int, int] = field(default_factory=dict)
    nonfinite: set[int] = field(default_factory=set)  # ranks already reported
    # rank -> (spike step, the last step seen with a normal loss before it, the spike's bar, losses above it since)
    spiked: dict[int, tuple[int, int, float, int]] = field(default_factory=dict)


def zscore(window: deque[float] | list[float], value: float, relative_floor: float) -> tuple[float, float, float]:
    """(z, mean, std) of ``value`` against ``window``."""
    n = len(window)
    mean = sum(window) / n
    var = sum((x - mean) * (x - mean) for x in window) / n  # (not ** 2: a loss of 1e160 overflows, raising)
    std = max(math.sqrt(var), relative_floor * abs(mean), 1e-12)
    return (value - mean) / std, mean, std


class LossDetector:
    def __init__(self, config: LossConfig | None = None, state: LossState | None = None) -> None:
        self.config = config or LossConfig()
        self.state = state or LossState()

    def reset(self) -> None:
        """A relaunch resumes from a checkpoint: step numbers repeat, so per-rank step tracking restarts."""
        self.state.last_step.clear()
        self.state.quiet_until.clear()
        self.state.nonfinite.clear()
        self.state.spiked.clear()

    def observe(self, snapshot: LaunchView, now: float) -> list[DetectionEvent]:
        c = self.config
        s = self.state
        events: list[DetectionEvent] = []
        for v in snapshot.ranks():
            if v.loss is None or v.step is None or s.last_step.get(v.rank) == v.step:
                continue
            seen_before = s.last_step.get(v.rank)  # the previous step whose loss was seen (the heartbeats sample)
            s.last_step[v.rank] = v.step
            if not math.isfinite(v.loss):
                if v.rank not in s.nonfinite:
                    s.nonfinite.add(v.rank)
                    events.append(of_rank(NONFINITE_LOSS, v, "loss", v.loss,
                                          f"rank {v.rank} on {v.node} reported loss={v.loss!r} at step {v.step}"))
                continue
            s.nonfinite.discard(v.rank)
            if v.rank >= c.spike_ranks:
                continue
            window = s.windows.setdefault(v.rank, deque(maxlen=c.window))
            if v.rank in s.spiked:
                events += self._confirm(v)
            if len(window) >= c.min_samples and v.step >= s.quiet_until.get(v.rank, -1):
                z, mean, std = zscore(window, v.loss, c.relative_floor)
                if z > c.z:
                    s.quiet_until[v.rank] = v.step + c.cooldown_steps
                    events.append(of_rank(LOSS_SPIKE, v, "loss_zscore", z,
                                          f"rank {v.rank} step {v.step}: loss {v.loss!r} is {z:.1f} std above the mean "
                                          f"{mean:.4g} (std {std:.3g}) of the last {len(window)} observed losses",
                                          threshold=c.z))  # fmt: skip
                    if c.diverged_steps:
                        normal = seen_before if seen_before is not None and seen_before < v.step else v.step - 1
                        s.spiked[v.rank] = (v.step, normal, mean + c.z * std, 0)
            window.append(v.loss)
        return events

    def _confirm(self, v: Any) -> list[DetectionEvent]:
        """A loss after a spike on ``v.rank``: still above the spike's bar (counted; a divergence once there are
        ``diverged_steps`` in a row), or back under it (the spike is over)."""
        step, normal, bar, above = self.state.spiked[v.rank]
        if v.loss <= bar:
            del self.state.spiked[v.rank]
            return []
        above += 1
        if above < self.config.diverged_steps:
            self.state.spiked[v.rank] = (step, normal, bar, above)
            return []
        del self.state.spiked[v.rank]
        # value: the last step seen with a normal loss (the bad update came after the weights that gave it)
        return [of_rank(LOSS_DIVERGED, v, "last_normal_step", normal,
                        f"rank {v.rank}: the loss did not come back after its spike at step {step} (the last normal loss "
                        f"seen: step {normal}): {above} losses in a row above {bar:.4g} (now {v.loss!r} at step "
                        f"{v.step})")]  # fmt: skip

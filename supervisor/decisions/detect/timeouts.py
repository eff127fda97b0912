"""Learned per-phase timeouts: no manual calibration call, no hand-tuned seconds.

A step phase's timeout is ``max(floor, k * p99)`` of the iteration times observed so far (after a warm-up);
other phases (checkpoint, eval, ...) learn from how long they took before, with a generous default until the
first one has been seen; a rank that has not finished its first step gets the long init allowance (compile,
data loading, NCCL setup). Observations go into a fixed log-bucket histogram: O(1) memory and time per
sample, and older samples fade (weights halve when the total passes a cap) so the timeout follows a job whose
speed changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

STEP = "step"
INIT = "init"
CHECKPOINT = "checkpoint"


@dataclass(frozen=True)
class TimeoutConfig:
    """Defaults suit steps from milliseconds to minutes; every value is seconds unless named otherwise."""

    step_floor_s: float = 5.0  # never call a step hung sooner than this
    step_k: float = 3.0  # timeout = k x p99 of observed iteration times
    quantile: float = 0.99
    warmup_samples: int = 20  # iteration-time samples (all ranks together) before the learned timeout applies
    warmup_timeout_s: float = 300.0  # step-phase timeout during warm-up
    init_allowance_s: float = 900.0  # before a rank's first completed step (includes the first step)
    checkpoint_allowance_s: float = 900.0  # checkpoint phase, until one checkpoint duration was observed
    phase_allowance_s: float = 900.0  # other named phases (eval, ...), until one was observed
    phase_floor_s: float = 60.0
    phase_k: float = 3.0
    decay_cap: float = 10_000.0  # total histogram weight at which all weights halve

    def __post_init__(self) -> None:
        for name in (
            "step_floor_s",
            "step_k",
            "warmup_timeout_s",
            "init_allowance_s",
            "checkpoint_allowance_s",
            "phase_allowance_s",
            "phase_floor_s",
            "phase_k",
            "decay_cap",
        ):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"detect.{name} must be a positive number of seconds/factor, got {value!r}")
        if not 0.5 <= self.quantile < 1.0:
            raise ValueError(f"detect.quantile must be in [0.5, 1), got {self.quantile!r} (try 0.99)")
        if self.warmup_samples < 1:
            raise ValueError(f"detect.warmup_samples must be >= 1, got {self.warmup_samples!r}")


# Buckets: [LO * R^i, LO * R^(i+1)) for i in 0..N-1; below LO -> bucket 0, above the top -> the last bucket.
_LO = 1e-4
_RATIO = 1.08
_N = int(math.ceil(math.log(1e5 / _LO) / math.log(_RATIO)))


@dataclass
class LogHistogram:
    """Streaming quantiles with bounded relative error (one bucket, 8 %), rounded *up* to stay conservative."""

    weights: list[float] = field(default_factory=lambda: [0.0] * _N)
    total: float = 0.0
    count: int = 0  # samples ever added (not decayed): used for warm-up
    max_seen: float = 0.0

    def add(self, value: float, decay_cap: float = 10_000.0) -> None:
        if not (math.isfinite(value) and value >= 0):
            return
        index = 0 if value < _LO else min(_N - 1, int(math.log(value / _LO) / math.log(_RATIO)))
        self.weights[index] += 1.0
        self.total += 1.0
        self.count += 1
        self.max_seen = max(self.max_seen, value)
        if self.total > decay_cap:
            self.weights = [w * 0.5 for w in self.weights]
            self.total *= 0.5

    def quantile(self, q: float) -> float:
        """Upper edge of the bucket holding the q-quantile (0.0 when empty); never above the largest sample."""
        if self.total <= 0:
            return 0.0
        target = q * self.total
        running = 0.0
        for index, weight in enumerate(self.weights):
            running += weight
            if running >= target and weight > 0:
                return min(_LO * _RATIO ** (index + 1), self.max_seen) if index < _N - 1 else self.max_seen
        return self.max_seen


@dataclass
class PhaseTimeouts:
    """The learned timeouts. State is plain data: copy it to snapshot, compare it in tests."""

    config: TimeoutConfig = field(default_factory=TimeoutConfig)
    histograms: dict[str, LogHistogram] = field(default_factory=dict)

    def observe(self, phase: str, seconds: float) -> None:
        """One iteration time (phase "step") or one whole phase duration (any other phase)."""
        self.histograms.setdefault(phase, LogHistogram()).add(seconds, self.config.decay_cap)

    def timeout(self, phase: str | None, first_step_done: bool = True) -> float:
        """How long a rank in ``phase`` may go without a beat before it counts as hung."""
        c = self.config
        if phase in (None, INIT) or (phase == STEP and not first_step_done):
            return c.init_allowance_s
        hist = self.histograms.get(phase)
        if phase == STEP:
            if hist is None or hist.count < c.warmup_samples:
                return c.warmup_timeout_s
            return max(c.step_floor_s, c.step_k * hist.quantile(c.quantile))
        if hist is None or hist.count == 0:
            return c.checkpoint_allowance_s if phase == CHECKPOINT else c.phase_allowance_s
        return max(c.phase_floor_s, c.phase_k * hist.quantile(c.quantile))

    def learned(self) -> dict[str, float]:
        """Current timeouts per observed phase (for status output and the journal)."""
        return {phase: self.timeout(phase) for phase in sorted(self.histograms)}

    def to_dict(self) -> dict[str, Any]:
        """JSON form of what was learned (non-empty buckets only), so a requeued run starts where this one was."""
        return {
            phase: {"buckets": {str(i): w for i, w in enumerate(h.weights) if w > 0}, "total": h.total,
                    "count": h.count, "max_seen": h.max_seen}
            for phase, h in self.histograms.items()
        }  # fmt: skip

    def restore(self, data: Mapping[str, Any]) -> None:
        """Load what ``to_dict`` wrote (ignoring anything malformed: relearning is the safe fallback)."""
        if not isinstance(data, Mapping):
            return
        for phase, h in data.items():
            try:
                hist = LogHistogram(total=float(h["total"]), count=int(h["count"]), max_seen=float(h["max_seen"]))
                for index, weight in h["buckets"].items():
                    if 0 <= int(index) < _N and float(weight) >= 0:
                        hist.weights[int(index)] = float(weight)
                if not all(math.isfinite(x) for x in (hist.total, hist.max_seen, *hist.weights)) or hist.count < 0:
                    continue
            except (KeyError, TypeError, ValueError, AttributeError, OverflowError):
                continue
            self.histograms[str(phase)] = hist

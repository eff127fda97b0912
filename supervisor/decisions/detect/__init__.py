"""Pure detectors over snapshots of the live per-rank table.

``Detector(config).observe(snapshot, now)`` returns the new findings since the previous call (each condition
is reported once, at onset, and re-armed when it clears). All state is in plain dataclasses on the detector
(``.hang.state``, ``.timeouts``, ``.straggler.state``, ``.loss.state``): ``copy.deepcopy`` snapshots it.
Nothing here reads a clock, a file or a socket.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from supervisor.decisions.detect.findings import (
    FAULT_KINDS,
    GLOBAL_STALL,
    HANG_KINDS,
    LOSS_DIVERGED,
    LOSS_SPIKE,
    NODE_LOST,
    NODE_SILENT,
    NONFINITE_LOSS,
    RANK_EXITED,
    RANK_HANG,
    RANK_STOPPED,
    STRAGGLER,
    WARNING_KINDS,
    DetectionEvent,
    LaunchView,
    NodeRanks,
    RankView,
    snapshot_from_live,
)
from supervisor.decisions.detect.hang import HangConfig, HangDetector, HangState
from supervisor.decisions.detect.loss import LossConfig, LossDetector, LossState
from supervisor.decisions.detect.straggler import StragglerConfig, StragglerDetector, StragglerState
from supervisor.decisions.detect.timeouts import LogHistogram, PhaseTimeouts, TimeoutConfig

__all__ = [
    "FAULT_KINDS",
    "GLOBAL_STALL",
    "HANG_KINDS",
    "LOSS_DIVERGED",
    "LOSS_SPIKE",
    "NODE_LOST",
    "NODE_SILENT",
    "NONFINITE_LOSS",
    "RANK_EXITED",
    "RANK_HANG",
    "RANK_STOPPED",
    "STRAGGLER",
    "WARNING_KINDS",
    "CONFIG_KEYS",
    "DetectConfig",
    "DetectionEvent",
    "Detector",
    "HangConfig",
    "HangDetector",
    "HangState",
    "LogHistogram",
    "LossConfig",
    "LossDetector",
    "LossState",
    "NodeRanks",
    "PhaseTimeouts",
    "RankView",
    "LaunchView",
    "StragglerConfig",
    "StragglerDetector",
    "StragglerState",
    "TimeoutConfig",
    "snapshot_from_live",
]


# Flat ``[detect]`` keys of the config file -> (part, field). Straggler and loss keys carry a prefix.
_PARTS = {"timeouts": TimeoutConfig, "hang": HangConfig, "straggler": StragglerConfig, "loss": LossConfig}
_PREFIX = {"timeouts": "", "hang": "", "straggler": "straggler_", "loss": "loss_"}
CONFIG_KEYS: dict[str, tuple[str, str]] = {
    _PREFIX[part] + f.name: (part, f.name) for part, cls in _PARTS.items() for f in fields(cls)
}


@dataclass(frozen=True)
class DetectConfig:
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    hang: HangConfig = field(default_factory=HangConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    loss: LossConfig = field(default_factory=LossConfig)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> DetectConfig:
        """From the config file's flat ``[detect]`` table; unknown keys and wrong types raise ValueError naming
        the key."""
        chosen: dict[str, dict[str, Any]] = {part: {} for part in _PARTS}
        for key, value in data.items():
            if key not in CONFIG_KEYS:
                raise ValueError(f"detect.{key}: unknown setting; known settings: {', '.join(sorted(CONFIG_KEYS))}")
            part, name = CONFIG_KEYS[key]
            default = getattr(_PARTS[part](), name)
            number_ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if (isinstance(default, int) and not isinstance(value, int)) or isinstance(value, bool) or not number_ok:
                kind = "a whole number" if isinstance(default, int) else "a number"
                raise ValueError(f"detect.{key} must be {kind}, got {value!r}")
            chosen[part][name] = value
        return cls(**{part: _PARTS[part](**values) for part, values in chosen.items()})  # type: ignore[arg-type]


class Detector:
    """All detectors behind one ``observe``; the learned timeouts survive :meth:`new_launch`."""

    def __init__(self, config: DetectConfig | None = None) -> None:
        self.config = config or DetectConfig()
        self.timeouts = PhaseTimeouts(self.config.timeouts)
        self.hang = HangDetector(self.config.hang, self.timeouts)
        self.straggler = StragglerDetector(self.config.straggler)
        self.loss = LossDetector(self.config.loss)

    def observe(self, snapshot: LaunchView, now: float) -> list[DetectionEvent]:
        events = self.hang.observe(snapshot, now)
        events += self.loss.observe(snapshot, now)
        events += self.straggler.observe(snapshot, now)
        return events

    def new_launch(self) -> None:
        """The training step was relaunched: forget processes and alarms, keep what was learned."""
        self.hang.reset()
        self.loss.reset()
        self.straggler.state = StragglerState()

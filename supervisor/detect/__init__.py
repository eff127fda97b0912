"""Pure detectors over snapshots of the live per-rank table.

``Detector(config).observe(snapshot, now)`` returns the new findings since the previous call (each condition
is reported once, at onset, and re-armed when it clears). All state is in plain dataclasses on the detector
(``.hang.state``, ``.timeouts``, ``.straggler.state``, ``.loss.state``): ``copy.deepcopy`` snapshots it.
Nothing here reads a clock, a file or a socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from supervisor.detect.hang import HangConfig, HangDetector, HangState
from supervisor.detect.loss import LossConfig, LossDetector, LossState
from supervisor.detect.model import (
    FAULT_KINDS,
    GLOBAL_STALL,
    HANG_KINDS,
    LOSS_SPIKE,
    NODE_SILENT,
    NONFINITE_LOSS,
    RANK_EXITED,
    RANK_HANG,
    RANK_STOPPED,
    STRAGGLER,
    WARNING_KINDS,
    DetectionEvent,
    NodeView,
    RankView,
    Snapshot,
    snapshot_from_live,
)
from supervisor.detect.straggler import StragglerConfig, StragglerDetector, StragglerState
from supervisor.detect.timeouts import LogHistogram, PhaseTimeouts, TimeoutConfig

__all__ = [
    "FAULT_KINDS",
    "GLOBAL_STALL",
    "HANG_KINDS",
    "LOSS_SPIKE",
    "NODE_SILENT",
    "NONFINITE_LOSS",
    "RANK_EXITED",
    "RANK_HANG",
    "RANK_STOPPED",
    "STRAGGLER",
    "WARNING_KINDS",
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
    "NodeView",
    "PhaseTimeouts",
    "RankView",
    "Snapshot",
    "StragglerConfig",
    "StragglerDetector",
    "StragglerState",
    "TimeoutConfig",
    "snapshot_from_live",
]


@dataclass(frozen=True)
class DetectConfig:
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    hang: HangConfig = field(default_factory=HangConfig)
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    loss: LossConfig = field(default_factory=LossConfig)


class Detector:
    """All detectors behind one ``observe``; the learned timeouts survive :meth:`new_launch`."""

    def __init__(self, config: DetectConfig | None = None) -> None:
        self.config = config or DetectConfig()
        self.timeouts = PhaseTimeouts(self.config.timeouts)
        self.hang = HangDetector(self.config.hang, self.timeouts)
        self.straggler = StragglerDetector(self.config.straggler)
        self.loss = LossDetector(self.config.loss)

    def observe(self, snapshot: Snapshot, now: float) -> list[DetectionEvent]:
        events = self.hang.observe(snapshot, now)
        events += self.loss.observe(snapshot, now)
        events += self.straggler.observe(snapshot, now)
        return events

    def new_launch(self) -> None:
        """The training step was relaunched: forget processes and alarms, keep what was learned."""
        self.hang.reset()
        self.loss.reset()
        self.straggler.state = StragglerState()

"""Health checks from the node agent: every ``interval_s`` (default 30 s) and at start, findings with the
node named, for the supervisor's classifier (``Evidence.gpu_faults``) and ledger.

The agent keeps NVML open and an Xid event set registered between checks (events between two checks are
collected, not missed); the kernel log is read at start only (older Xids are history the event set does not see).
Entry points: :func:`agent_checks` (one-shot) and :class:`AgentHealth` (periodic, ``poll(now)``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from supervisor.health.checks import FATAL, Limits, NodeReading, Problem, evaluate
from supervisor.health.reading import XidWatcher, open_nvml, read_node

DEFAULT_INTERVAL_S = 30.0
DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class NodeFinding:
    """A health problem on one node: the evidence the classifier and ledger take (``fatal`` blames the node)."""

    node: str
    severity: str
    check: str
    value: str
    threshold: str
    what: str
    fix: str

    @property
    def fatal(self) -> bool:
        return self.severity == FATAL

    def as_detection(self) -> dict[str, Any]:
        """Detection-shaped dict for ``alerts.build(..., detections=[...])``: the alert then carries this check's
        metric, value and threshold."""
        return {"kind": "hardware", "metric": self.check, "value": self.value, "threshold": self.threshold,
                "duration_s": None, "nodes": [self.node], "evidence": [self.what]}

    def evidence(self) -> str:
        """One line for ``classify.Evidence.gpu_faults[node]``."""
        return f"{self.what} ({self.check} {self.value}, threshold {self.threshold})"


def findings(reading: NodeReading, problems: list[Problem]) -> list[NodeFinding]:
    return [NodeFinding(reading.node, p.severity, p.check, p.value, p.threshold, p.what, p.fix) for p in problems]


def agent_checks(
    node: str,
    filesystems: Mapping[str, str] | None = None,
    expected_gpus: int | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> list[NodeFinding]:
    """One full check of this node (NVML opened and closed here, kernel-log Xids included)."""
    reading = read_node(expected_gpus, filesystems, node=node)
    return findings(reading, evaluate(reading, limits))


class AgentHealth:
    """Periodic checks for the node agent's loop: ``poll(now)`` returns findings when a check was due
    (the first call always checks), else None. Never raises."""

    def __init__(
        self,
        node: str,
        filesystems: Mapping[str, str] | None = None,
        expected_gpus: int | None = None,
        limits: Limits = DEFAULT_LIMITS,
        interval_s: float = DEFAULT_INTERVAL_S,
    ) -> None:
        if not interval_s > 0:
            raise ValueError(f"health interval must be > 0 s, got {interval_s!r}")
        self.node, self.filesystems, self.expected_gpus = node, dict(filesystems or {}), expected_gpus
        self.limits, self.interval_s = limits, interval_s
        self.next_at: float | None = None
        self.nvml, self.nvml_status = open_nvml()
        self.xids = XidWatcher(self.nvml) if self.nvml is not None else None
        if self.xids is not None and self.xids.problem:
            self.nvml_status = f"ok ({self.xids.problem})"
        self.last: list[NodeFinding] = []

    def poll(self, now: float | None = None, clock_offset_s: float | None = None) -> list[NodeFinding] | None:
        """``clock_offset_s``: this node's wall clock minus the batch host's, as the agent measures it from the
        supervisor's frames (their send time vs its own clock), when known."""
        now = time.monotonic() if now is None else now
        if self.next_at is not None and now < self.next_at:
            return None
        first = self.next_at is None
        self.next_at = now + self.interval_s
        try:
            events = self.xids.drain() if self.xids is not None else ()
            reading = read_node(self.expected_gpus, self.filesystems, node=self.node, kernel_log=first,
                                nvml_xids=events, nvml=self.nvml, nearest_existing=True)  # fmt: skip
            if self.nvml is None:
                reading = _with_status(reading, self.nvml_status)
            if clock_offset_s is not None:
                reading = replace(reading, clock_offset_s=clock_offset_s)
            self.last = findings(reading, evaluate(reading, self.limits))
        except Exception as err:  # noqa: BLE001 - a probe bug must not stop the agent; said as a warning
            self.last = [NodeFinding(self.node, "warn", "health_probe", "error", "none",
                                     f"health probe failed: {type(err).__name__}: {err}", "report this bug")]  # fmt: skip
        return self.last

    def close(self) -> None:
        if self.xids is not None:
            self.xids.close()
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass
            self.nvml = None


def _with_status(reading: NodeReading, status: str) -> NodeReading:
    return replace(reading, nvml=status)

"""The node agent's health checks: ``health.periodic.AgentHealth`` run in a thread (at start, then every
``--health-interval`` seconds), each result turned into one ``wire.EVENT_HEALTH`` event for the supervisor.

Why a thread: a reading may take seconds (NVML on a sick GPU, statvfs on a slow NFS mount, each under its own
deadline); the sampling loop must keep reporting heartbeats meanwhile, or the node would look silent.
"""

from __future__ import annotations

import argparse
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from supervisor.errors import UsageError
from supervisor.heartbeat import wire

if TYPE_CHECKING:
    from supervisor.health.periodic import AgentHealth, NodeFinding


def report_event(check_number: int, nvml: str, findings: list[NodeFinding]) -> wire.Event:
    """One check as the wire's health event (``rank`` carries the check's number)."""
    items = [wire.HealthItem(f.severity, f.check, f.value, f.threshold, f.what, f.fix) for f in findings]
    return wire.Event(wire.EVENT_HEALTH, check_number & 0xFFFFFFFF, wire.encode_health(nvml, items))


class HealthThread:
    """Runs ``AgentHealth.poll`` off the agent's loop; ``events()`` hands over the finished checks."""

    def __init__(self, health: AgentHealth, clock_offset: Callable[[], float | None]) -> None:
        self.health, self.clock_offset = health, clock_offset
        self.done: queue.Queue[wire.Event] = queue.Queue(maxsize=16)
        self.stop = threading.Event()
        self.checks = 0
        self.thread = threading.Thread(target=self._run, name="agent-health", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def _run(self) -> None:
        wait = 0.0
        while not self.stop.wait(wait):
            findings = self.health.poll(clock_offset_s=self.clock_offset())  # never raises
            if findings is not None:
                self.checks += 1
                try:
                    self.done.put_nowait(report_event(self.checks, self.health.nvml_status, findings))
                except queue.Full:  # the loop stopped taking them: the newest check supersedes anyway
                    pass
            wait = max(0.05, min(self.health.interval_s, (self.health.next_at or 0.0) - time.monotonic()))

    def events(self) -> list[wire.Event]:
        out = []
        while True:
            try:
                out.append(self.done.get_nowait())
            except queue.Empty:
                return out

    def close(self, timeout_s: float = 2.0) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout_s)
        if not self.thread.is_alive():  # a probe stuck past its deadline keeps NVML: leave it to the exit
            self.health.close()


def _pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key or not rest:
            raise UsageError(f"{flag} {value!r} is not KEY=VALUE", f"pass e.g. {flag} checkpoint=/scratch/ckpt")
        out[key] = rest
    return out


def health_from_args(args: argparse.Namespace) -> AgentHealth | None:
    """The agent's checker from its command line; None when ``--health-interval 0``."""
    if args.health_interval == 0:
        return None
    if not args.health_interval > 0:
        raise UsageError(f"--health-interval {args.health_interval!r} must be >= 0", "pass e.g. 30 (0: no checks)")
    if args.expect_gpus is not None and args.expect_gpus < 0:
        raise UsageError("--expect-gpus must be >= 0", "pass the GPUs per node of the allocation")
    from supervisor.health.checks import Limits
    from supervisor.health.periodic import AgentHealth

    try:
        limits = Limits.from_pairs(args.health_limit)
    except ValueError as err:
        raise UsageError(str(err), "see docs/health.md for the thresholds") from None
    filesystems = {role: os.path.abspath(path) for role, path in _pairs(args.health_fs, "--health-fs").items()}
    return AgentHealth(args.node, filesystems, args.expect_gpus, limits, interval_s=args.health_interval)

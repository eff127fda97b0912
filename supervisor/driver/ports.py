"""What the driver needs from the outside world, as protocols: the heartbeat channel, a launched process and
the step launcher. The real implementations are ``heartbeat.server.AggregatorServer``, ``subprocess.Popen``
and ``driver.launcher``; the unit tests drive the loop with in-process fakes of the same shape
(tests/unit/fakes.py). The Slurm side is ``slurm.client.SlurmClient``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol


class Process(Protocol):
    """A launched job step's local process (srun): the subset of ``subprocess.Popen`` the driver uses."""

    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...


class Channel(Protocol):
    """The supervisor's end of the heartbeat path: receives node summaries into ``table``, sends commands."""

    table: Any  # heartbeat LiveTable: snapshot(), node_views(), nodes, events, health, memory, replication

    @property
    def address(self) -> tuple[str, int]: ...

    def write_address_file(self) -> Path: ...

    def poll(self, timeout: float) -> int: ...

    def send(self, node: str, cmds: Sequence[Any]) -> bool: ...

    def send_order(self, node: str, text: str) -> bool: ...

    def close(self) -> None: ...


class StepLauncher(Protocol):
    """Starts one job step (srun argv) with its output appended to ``log_path``."""

    def __call__(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: str | None = None
    ) -> Process: ...

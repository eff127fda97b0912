"""The one interface the supervisor uses to talk to Slurm, and the factory that picks a backend.

Backends: ``cli`` (the Slurm commands; works everywhere, the default) and ``pyslurm`` (libslurm bindings), asked
for with ``$SUPERVISOR_SLURM_BACKEND=pyslurm`` (or ``auto``: pyslurm when it imports and was built for the running
Slurm, else cli). pyslurm is opt-in, not the default: PyPI has pyslurm 25.11 only, which must match Slurm 25.11
exactly, and no Slurm this project can run in its tests is 25.11 (Debian ships 22.05, 24.11 and 26.05), so it is
never tested here; a backend that silently replaced the tested one on a 25.11 site would be the untested path.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from slurm.cli_backend import CliSlurmClient, SignalTarget
from slurm.errors import BackendUnavailable, SlurmUsageError
from slurm.model import JobInfo, JobRun, NodeInfo
from slurm.retry import RetryPolicy

BACKENDS = ("auto", "cli", "pyslurm")


@runtime_checkable
class SlurmClient(Protocol):
    """Queries return typed records; actions return None or raise a ``slurm.errors`` exception."""

    backend_name: str

    def job(self, job_id: str | int) -> JobInfo | None:
        """Current state, or None once slurmctld has forgotten the job (MinJobAge)."""
        ...

    def nodes(self, names: Iterable[str] | None = None) -> list[NodeInfo]: ...

    def node(self, name: str) -> NodeInfo | None: ...

    def history(self, job_id: str | int) -> list[JobRun]:
        """One record per run (requeue); raises ``AccountingUnavailable`` without slurmdbd."""
        ...

    def submit(self, script_text: str, options: Sequence[str] = ()) -> str: ...

    def requeue(self, job_id: str | int) -> None: ...

    def requeue_hold(self, job_id: str | int) -> None: ...

    def release(self, job_id: str | int) -> None: ...

    def hold(self, job_id: str | int) -> None: ...

    def cancel(self, job_id: str | int) -> None: ...

    def signal(self, job_id: str | int, sig: int | str, target: SignalTarget = "steps") -> None: ...

    def signal_step(self, step_id: str, sig: int | str) -> None:
        """Signal the tasks of one step (``123.0``)."""
        ...

    def step_ids(self, job_id: str | int) -> dict[str, str]:
        """The job's live steps: {step name: step id ("123.4")}."""
        ...

    def cancel_step(self, step_id: str, sig: int | str = "KILL") -> None:
        """Signal every task of one step on all its nodes at once."""
        ...

    def node_address(self, node: str) -> str | None:
        """The node's NodeAddr, or None when Slurm has none for it."""
        ...

    def node_addresses(self, nodes: Iterable[str]) -> dict[str, str]:
        """NodeAddr of each node in one query; a node missing from the answer is unknown."""
        ...

    def update_excluded_nodes(self, job_id: str | int, nodes: Iterable[str]) -> None:
        """Replace the job's ExcNodeList (PENDING/COMPLETING only): pass the full set to exclude."""
        ...

    def shrink_job(self, job_id: str | int, nodes: Iterable[str]) -> None:
        """Shrink a running job to ``nodes`` (its other nodes leave the allocation; the owner may, not for the
        batch host)."""
        ...

    def set_start_time(self, job_id: str | int, delay_s: int) -> None:
        """StartTime of a pending job (also while it completes after a requeue): ``delay_s`` from now."""
        ...

    def config(self) -> dict[str, str]:
        """slurmctld's running configuration as {Key: Value} (``scontrol show config``)."""
        ...

    def partition(self, name: str) -> dict[str, str] | None:
        """One partition's settings as {Key: Value} (``scontrol show partition NAME -o``); None: no such one."""
        ...

    def switches(self) -> dict[str, str]:
        """node -> its leaf switch or block (``scontrol show topology``); empty without a topology plugin."""
        ...

    def drain(self, nodes: Iterable[str], reason: str) -> None: ...

    def reboot(self, nodes: Iterable[str], reason: str) -> None:
        """Reboot once idle (ASAP: drained meanwhile), then back to service (nextstate=RESUME)."""
        ...

    def resume(self, nodes: Iterable[str]) -> None: ...


BACKEND_ENV = "SUPERVISOR_SLURM_BACKEND"


def get_client(
    backend: str | None = None, env: Mapping[str, str] | None = None, policy: RetryPolicy | None = None
) -> SlurmClient:
    """``backend`` None: ``$SUPERVISOR_SLURM_BACKEND``, else ``cli``. ``auto``: pyslurm when it imports and
    matches the running Slurm, else the CLI backend; ``pyslurm``: pyslurm or ``BackendUnavailable``."""
    if backend is None:
        backend = os.environ.get(BACKEND_ENV) or "cli"
        if backend not in BACKENDS:
            raise SlurmUsageError(f"{BACKEND_ENV}={backend!r} is not a Slurm backend",
                                  f"set it to one of {', '.join(BACKENDS)}, or unset it (cli)")  # fmt: skip
    if backend not in BACKENDS:
        raise SlurmUsageError(f"unknown Slurm backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
    cli = CliSlurmClient(env=env, policy=policy)
    if backend == "cli":
        return cli
    from slurm import pyslurm_backend  # import-guarded inside: never fails at import time

    if backend == "pyslurm":
        return pyslurm_backend.PyslurmClient(cli)  # raises BackendUnavailable with the reason
    try:
        return pyslurm_backend.PyslurmClient(cli)
    except BackendUnavailable:
        return cli

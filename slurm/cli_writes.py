"""The ``scontrol`` commands that change Slurm's state: requeue, hold/release, job updates, drain/resume.

Why a module of their own: ``cli_backend.py`` is the plumbing (retries, typed errors) and the queries; these are
the writes, each one argument list built from validated parts and handed to that plumbing. Each says whether a
retry is safe: a requeue or a shrink that timed out may have been applied, so it is sent once
(``idempotent=False``); setting a field to a value is safe to repeat. ``CliSlurmClient`` inherits them, so the
client's interface is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from slurm.errors import SlurmUsageError
from slurm.hostlist import compress, validate_job_id, validate_node_name


class _Runs(Protocol):
    """What the writes need of the client they are mixed into (``CliSlurmClient``)."""

    env: dict[str, str]

    def run(
        self, argv: Sequence[str], *, idempotent: bool = ..., env: Mapping[str, str] | None = ...
    ) -> object: ...


def node_hostlist(nodes: Iterable[str]) -> str:
    """Validated node names as one hostlist expression (``node[1-2]``); no nodes is a SlurmUsageError."""
    names = [validate_node_name(n) for n in nodes]
    if not names:
        raise SlurmUsageError("no nodes given", "name at least one node")
    return compress(names)


def _validate_reason(reason: str) -> str:
    if not reason or not reason.strip() or len(reason) > 256 or any(c in reason for c in "\r\n\0"):
        raise SlurmUsageError(
            f"invalid node reason {reason!r}", "give a one-line reason of at most 256 characters"
        )
    return reason.strip()


class ScontrolWrites:
    """The state-changing ``scontrol`` calls of ``CliSlurmClient`` (mixed in; they run through its ``run``)."""

    def requeue(self: _Runs, job_id: str | int) -> None:
        """Requeue the job (its batch script restarts; SLURM_RESTART_COUNT increases)."""
        self.run(["scontrol", "requeue", validate_job_id(job_id)], idempotent=False)

    def requeue_hold(self: _Runs, job_id: str | int) -> None:
        """Requeue the job and hold it until ``release``."""
        self.run(["scontrol", "requeuehold", validate_job_id(job_id)], idempotent=False)

    def release(self: _Runs, job_id: str | int) -> None:
        self.run(["scontrol", "release", validate_job_id(job_id)])

    def hold(self: _Runs, job_id: str | int) -> None:
        self.run(["scontrol", "hold", validate_job_id(job_id)])

    def update_excluded_nodes(self: _Runs, job_id: str | int, nodes: Iterable[str]) -> None:
        """Set the job's ExcNodeList (replaces it; empty clears). Slurm accepts this only while the job is
        PENDING (or COMPLETING after a requeue); on a running job it raises ``SlurmCommandError``."""
        names = [validate_node_name(n) for n in nodes]
        value = compress(names) if names else ""
        self.run(["scontrol", "update", f"JobId={validate_job_id(job_id)}", f"ExcNodeList={value}"])

    def shrink_job(self: _Runs, job_id: str | int, nodes: Iterable[str]) -> None:
        """``scontrol update JobId=J NodeList=<nodes>`` on a running job: the job keeps only ``nodes``. Run
        without SLURM_JOBID in the environment: inside a job, scontrol would write slurm_job_J_resize.{sh,csh}
        into its working directory (the user's)."""
        names = [validate_node_name(n) for n in nodes]
        if not names:
            raise SlurmUsageError("no nodes to keep", "a job cannot be shrunk to nothing")
        env = {k: v for k, v in self.env.items() if k != "SLURM_JOBID"}
        self.run(["scontrol", "update", f"JobId={validate_job_id(job_id)}", f"NodeList={compress(names)}"],
                 idempotent=False, env=env)  # fmt: skip

    def set_start_time(self: _Runs, job_id: str | int, delay_s: int) -> None:
        """``scontrol update JobId=J StartTime=now+N`` (Slurm accepts it while the job is PENDING, which includes
        COMPLETING after a requeue)."""
        if isinstance(delay_s, bool) or not isinstance(delay_s, int) or delay_s < 0:
            raise SlurmUsageError(f"invalid start delay {delay_s!r}", "give whole seconds >= 0")
        self.run(["scontrol", "update", f"JobId={validate_job_id(job_id)}", f"StartTime=now+{delay_s}"])

    def drain(self: _Runs, nodes: Iterable[str], reason: str) -> None:
        """Drain nodes (running jobs finish, no new ones start). Needs operator rights."""
        self.run(
            ["scontrol", "update", f"NodeName={node_hostlist(nodes)}", "State=DRAIN", f"Reason={_validate_reason(reason)}"]
        )

    def resume(self: _Runs, nodes: Iterable[str]) -> None:
        """Return drained/down nodes to service. Needs operator rights."""
        self.run(["scontrol", "update", f"NodeName={node_hostlist(nodes)}", "State=RESUME"])

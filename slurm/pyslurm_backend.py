"""``SlurmClient`` on pyslurm (libslurm bindings): saves a fork+exec per poll on busy clusters.

UNTESTED HERE: PyPI only has pyslurm 25.11, which needs Slurm 25.11 headers and refuses older libslurm
("Slurm version mismatch"); this project's test clusters run 22.05 and 24.11. The module therefore imports
pyslurm lazily, refuses to start unless pyslurm's major.minor equals the running Slurm's, and keeps its own
surface small: job/node queries and the plain job actions use pyslurm; ``submit`` (sbatch flag syntax),
``history`` (sacct), ExcNodeList updates and drain/resume go through the CLI backend it wraps.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from slurm.cli_backend import CliSlurmClient, SignalTarget, signal_name
from slurm.errors import BackendUnavailable, SlurmCommandError, SlurmUnreachable, SlurmUsageError
from slurm.hostlist import validate_job_id, validate_node_name
from slurm.model import JobInfo, JobRun, NodeInfo
from slurm.parse import (
    job_info,
    node_state,
    text,
    timestamp,
)
from slurm.retry import Failure, classify_failure

T = TypeVar("T")


def _major_minor(version: str) -> str:
    return ".".join(version.strip().split(".")[:2])


def load_pyslurm() -> Any:
    """Import pyslurm or raise ``BackendUnavailable`` saying why (missing, or built for another Slurm)."""
    try:
        return importlib.import_module("pyslurm")
    except ImportError as exc:
        raise BackendUnavailable(
            "pyslurm", f"it does not import ({exc})", "pip install pyslurm matching your Slurm, or unset SUPERVISOR_SLURM_BACKEND (cli)"
        ) from None
    except Exception as exc:  # pyslurm raises on a libslurm version mismatch at import
        raise BackendUnavailable("pyslurm", str(exc), "unset SUPERVISOR_SLURM_BACKEND (the cli backend)") from None


class PyslurmClient:
    """pyslurm for queries and job actions; the wrapped CLI client for everything else."""

    backend_name = "pyslurm"

    def __init__(self, cli: CliSlurmClient, module: Any = None) -> None:
        self.cli = cli
        if cli.env.get("SLURM_CONF") != os.environ.get("SLURM_CONF"):
            raise BackendUnavailable(
                "pyslurm",
                "libslurm reads SLURM_CONF from the process environment, which differs from the one requested",
                "export SLURM_CONF before starting, or use the cli backend",
            )
        self.pyslurm = module if module is not None else load_pyslurm()
        ours = _major_minor(str(getattr(self.pyslurm, "__version__", "")))
        running = _major_minor(cli.version())
        if not ours or ours != running:
            raise BackendUnavailable(
                "pyslurm",
                f"pyslurm {ours or '?'} does not match the running Slurm {running or '?'}",
                f"install pyslurm=={running}.* or use the cli backend",
            )

    def _call(self, what: Sequence[str], fn: Callable[[], T]) -> T:
        """Run a pyslurm call and map its RPCError onto this adapter's typed errors."""
        try:
            return fn()
        except self.pyslurm.RPCError as exc:
            message = str(exc)
            failure = classify_failure(1, message)
            if failure in (Failure.NOT_SENT, Failure.MAYBE_SENT):
                raise SlurmUnreachable(list(what), message) from None
            raise SlurmCommandError(list(what), 1, message) from None

    # ------------------------------------------------------------------------------------ queries

    def job(self, job_id: str | int) -> JobInfo | None:
        jid = validate_job_id(job_id)
        if not jid.isdigit():
            return self.cli.job(jid)  # array/het ids: pyslurm's Job.load takes a plain integer
        try:
            raw = self._call(["pyslurm.Job.load", jid], lambda: self.pyslurm.Job.load(int(jid)))
        except SlurmCommandError as exc:
            if classify_failure(1, exc.stderr) is Failure.UNKNOWN_JOB:
                return None
            raise
        fields = {key: getattr(raw, key, None) for key in _PYSLURM_KEYS.values()}
        return job_info(
            fields, _PYSLURM_KEYS, job_id=jid, raw_job_id=jid, source="pyslurm",
            exit_code=raw.exit_code or 0, exit_signal=raw.exit_code_signal or None,
            requeue=bool(raw.is_requeueable) if raw.is_requeueable is not None else None,
            time_limit_min=raw.time_limit if isinstance(raw.time_limit, int) else None,
        )  # fmt: skip

    def nodes(self, names: Iterable[str] | None = None) -> list[NodeInfo]:
        wanted = [validate_node_name(n) for n in names] if names is not None else None
        loaded = self._call(["pyslurm.Nodes.load"], lambda: self.pyslurm.Nodes.load())
        infos = []
        for node in loaded.values():
            base, flags = node_state(node.state)
            infos.append(
                NodeInfo(
                    name=node.name,
                    state=base,
                    flags=flags,
                    reason=text(node.reason),
                    reason_user=text(getattr(node, "reason_user", None)),
                    reason_time=timestamp(getattr(node, "reason_time", None)),
                    partitions=tuple(getattr(node, "partitions", None) or ()),
                    source="pyslurm",
                )
            )
        if wanted is None:
            return infos
        by_name = {n.name: n for n in infos}
        return [by_name[n] for n in wanted if n in by_name]

    def node(self, name: str) -> NodeInfo | None:
        found = self.nodes([name])
        return found[0] if found else None

    def history(self, job_id: str | int) -> list[JobRun]:
        return self.cli.history(job_id)

    # ------------------------------------------------------------------------------------ actions

    def submit(self, script_text: str, options: Sequence[str] = ()) -> str:
        return self.cli.submit(script_text, options)

    def _job(self, job_id: str | int) -> Any:
        jid = validate_job_id(job_id)
        if not jid.isdigit():
            raise SlurmUsageError(f"the pyslurm backend needs a plain job id, got {jid}", "use the cli backend")
        return self.pyslurm.Job(int(jid))

    def requeue(self, job_id: str | int) -> None:
        self._call(["pyslurm.Job.requeue", str(job_id)], lambda: self._job(job_id).requeue())

    def requeue_hold(self, job_id: str | int) -> None:
        self._call(["pyslurm.Job.requeue", str(job_id), "hold"], lambda: self._job(job_id).requeue(hold=True))

    def release(self, job_id: str | int) -> None:
        self._call(["pyslurm.Job.release", str(job_id)], lambda: self._job(job_id).release())

    def hold(self, job_id: str | int) -> None:
        self._call(["pyslurm.Job.hold", str(job_id)], lambda: self._job(job_id).hold())

    def cancel(self, job_id: str | int) -> None:
        self._call(["pyslurm.Job.cancel", str(job_id)], lambda: self._job(job_id).cancel())

    def signal(self, job_id: str | int, sig: int | str, target: SignalTarget = "steps") -> None:
        if target not in ("batch", "steps"):
            raise SlurmUsageError(f"invalid signal target {target!r}", "use 'batch' or 'steps'")
        name = "SIG" + signal_name(sig)
        steps = "batch" if target == "batch" else "children"
        self._call(
            ["pyslurm.Job.send_signal", str(job_id), name, steps],
            lambda: self._job(job_id).send_signal(name, steps=steps),
        )

    def signal_step(self, step_id: str, sig: int | str) -> None:
        self.cli.signal_step(step_id, sig)

    def step_ids(self, job_id: str | int) -> dict[str, str]:
        return self.cli.step_ids(job_id)

    def cancel_step(self, step_id: str, sig: int | str = "KILL") -> None:
        self.cli.cancel_step(step_id, sig)

    def node_address(self, node: str) -> str | None:
        return self.cli.node_address(node)

    def node_addresses(self, nodes: Iterable[str]) -> dict[str, str]:
        return self.cli.node_addresses(nodes)

    def update_excluded_nodes(self, job_id: str | int, nodes: Iterable[str]) -> None:
        self.cli.update_excluded_nodes(job_id, nodes)

    def shrink_job(self, job_id: str | int, nodes: Iterable[str]) -> None:
        self.cli.shrink_job(job_id, nodes)

    def set_start_time(self, job_id: str | int, delay_s: int) -> None:
        self.cli.set_start_time(job_id, delay_s)

    def config(self) -> dict[str, str]:
        return self.cli.config()

    def partition(self, name: str) -> dict[str, str] | None:
        return self.cli.partition(name)

    def switches(self) -> dict[str, str]:
        return self.cli.switches()

    def reboot(self, nodes: Iterable[str], reason: str) -> None:
        self.cli.reboot(nodes, reason)

    def drain(self, nodes: Iterable[str], reason: str) -> None:
        self.cli.drain(nodes, reason)

    def resume(self, nodes: Iterable[str]) -> None:
        self.cli.resume(nodes)


_PYSLURM_KEYS = {
    "state": "state", "name": "name", "reason": "state_reason", "restart_count": "requeue_count",
    "nodes": "allocated_nodes", "batch_host": "batch_host", "excluded_nodes": "excluded_nodes",
    "partition": "partition", "submit_time": "submit_time", "start_time": "start_time", "end_time": "end_time",
    "preempt_time": "preempt_time", "priority": "priority",
}  # fmt: skip

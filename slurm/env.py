"""A typed, validated view of the SLURM_* environment of the current process.

Read once (``SlurmEnv.from_environ()``), so the rest of the code never parses strings from ``os.environ``
and a malformed variable fails early with one clear message instead of deep inside a restart decision.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from slurm.errors import SlurmEnvError
from slurm.hostlist import expand, validate_job_id, validate_node_name

_TASKS_PER_NODE_RE = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")


def _first(env: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first non-empty variable among ``names`` (Slurm kept old aliases such as SLURM_JOBID)."""
    for name in names:
        value = env.get(name)
        if value is not None and value.strip() != "":
            return name, value.strip()
    return None


def _int(env: Mapping[str, str], *names: str, minimum: int = 0) -> int | None:
    found = _first(env, *names)
    if found is None:
        return None
    name, value = found
    try:
        number = int(value)
    except ValueError:
        raise SlurmEnvError(name, value, "expected an integer") from None
    if number < minimum:
        raise SlurmEnvError(name, value, f"expected an integer >= {minimum}")
    return number


def _str(env: Mapping[str, str], *names: str) -> str | None:
    found = _first(env, *names)
    return None if found is None else found[1]


# What SLURM_STEP_ID says in the batch script: nothing before 26.05; 26.05 exports SLURM_BATCH_SCRIPT (0xfffffffb)
# as a signed number (measured on the local 26.05.5 cluster, with SLURM_PROCID=0 beside it).
BATCH_STEP_IDS = frozenset({"batch", "-5", "4294967291"})


def is_srun_step(step_id: str | None) -> bool:
    """Whether SLURM_STEP_ID names a step srun made (``0``, ``1``...), not the batch script, the extern step or
    another of Slurm's own (26.05 exports those as negative numbers: -5 batch, -4 extern; older ones as
    0xfffffff0 and up)."""
    return step_id is not None and step_id.isascii() and step_id.isdigit() and int(step_id) < 0xFFFFFFF0


def parse_tasks_per_node(value: str) -> tuple[int, ...]:
    """``2(x3),1`` -> (2, 2, 2, 1): SLURM_TASKS_PER_NODE's run-length format."""
    counts: list[int] = []
    for piece in value.split(","):
        m = _TASKS_PER_NODE_RE.fullmatch(piece.strip())
        if not m:
            raise SlurmEnvError("SLURM_TASKS_PER_NODE", value, "expected a list like 2(x3),1")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(counts)


@dataclass(frozen=True)
class SlurmEnv:
    """What Slurm told this process about its job, step and task. Unknown values are None."""

    job_id: str | None = None
    job_name: str | None = None
    restart_count: int = 0
    nodelist: tuple[str, ...] = ()
    nnodes: int | None = None
    ntasks: int | None = None
    tasks_per_node: tuple[int, ...] = ()
    procid: int | None = None
    localid: int | None = None
    nodeid: int | None = None
    node_name: str | None = None
    """SLURMD_NODENAME: the node this process runs on."""
    step_id: str | None = None
    """SLURM_STEP_ID: ``0``, ``1``... for srun steps; in the batch script itself None (22.05, 24.11) or ``-5``
    (26.05: SLURM_BATCH_SCRIPT, 0xfffffffb, printed signed)."""
    submit_host: str | None = None
    submit_dir: str | None = None
    end_time: int | None = None
    """SLURM_JOB_END_TIME (epoch seconds; set by Slurm >= 23.02 only)."""
    start_time: int | None = None
    cluster_name: str | None = None
    partition: str | None = None
    array_job_id: str | None = None
    array_task_id: int | None = None

    @property
    def in_allocation(self) -> bool:
        """True inside a Slurm job (batch script, srun step or salloc shell)."""
        return self.job_id is not None

    @property
    def in_batch_step(self) -> bool:
        """True in the batch script, where the supervisor process runs."""
        return self.in_allocation and (self.step_id is None or self.step_id in BATCH_STEP_IDS)

    @property
    def batch_host(self) -> str | None:
        """The node running the batch script, known only from inside it (SLURMD_NODENAME there)."""
        return self.node_name if self.in_batch_step else None

    @property
    def world_size(self) -> int | None:
        """Total tasks of the step/job: SLURM_NTASKS, else the sum of SLURM_TASKS_PER_NODE."""
        if self.ntasks is not None:
            return self.ntasks
        return sum(self.tasks_per_node) if self.tasks_per_node else None

    @classmethod
    def from_environ(cls, env: Mapping[str, str] | None = None) -> SlurmEnv:
        """Parse ``env`` (default ``os.environ``); raises ``SlurmEnvError`` naming the bad variable."""
        env = os.environ if env is None else env
        job = _first(env, "SLURM_JOB_ID", "SLURM_JOBID")
        job_id = None
        if job is not None:
            try:
                job_id = validate_job_id(job[1])
            except Exception:
                raise SlurmEnvError(job[0], job[1], "expected a Slurm job id such as 123") from None
        nodes = _first(env, "SLURM_JOB_NODELIST", "SLURM_NODELIST")
        nodelist: tuple[str, ...] = ()
        if nodes is not None:
            try:
                nodelist = tuple(expand(nodes[1]))
            except Exception as exc:
                raise SlurmEnvError(nodes[0], nodes[1], str(exc)) from None
        node_name = _str(env, "SLURMD_NODENAME")
        if node_name is not None:
            try:
                validate_node_name(node_name)
            except Exception:
                raise SlurmEnvError("SLURMD_NODENAME", node_name, "not a valid node name") from None
        tpn = _str(env, "SLURM_TASKS_PER_NODE")
        array_job = _str(env, "SLURM_ARRAY_JOB_ID")
        if array_job is not None:
            try:
                validate_job_id(array_job)
            except Exception:
                raise SlurmEnvError("SLURM_ARRAY_JOB_ID", array_job, "expected a job id") from None
        return cls(
            job_id=job_id,
            job_name=_str(env, "SLURM_JOB_NAME"),
            restart_count=_int(env, "SLURM_RESTART_COUNT") or 0,
            nodelist=nodelist,
            nnodes=_int(env, "SLURM_JOB_NUM_NODES", "SLURM_NNODES", minimum=1),
            ntasks=_int(env, "SLURM_NTASKS", "SLURM_NPROCS", minimum=1),
            tasks_per_node=parse_tasks_per_node(tpn) if tpn is not None else (),
            procid=_int(env, "SLURM_PROCID"),
            localid=_int(env, "SLURM_LOCALID"),
            nodeid=_int(env, "SLURM_NODEID"),
            node_name=node_name,
            step_id=_str(env, "SLURM_STEP_ID", "SLURM_STEPID"),
            submit_host=_str(env, "SLURM_SUBMIT_HOST"),
            submit_dir=_str(env, "SLURM_SUBMIT_DIR"),
            end_time=_int(env, "SLURM_JOB_END_TIME"),
            start_time=_int(env, "SLURM_JOB_START_TIME"),
            cluster_name=_str(env, "SLURM_CLUSTER_NAME"),
            partition=_str(env, "SLURM_JOB_PARTITION"),
            array_job_id=array_job,
            array_task_id=_int(env, "SLURM_ARRAY_TASK_ID"),
        )

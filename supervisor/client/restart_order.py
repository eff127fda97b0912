"""The restart order: what the supervisor tells ranks that restart in their own process (``client.restartable``).

WHY a file next to the slots: an order carries more than the control area's words hold (the new generation's
rendezvous, where to resume), every rank on a node needs the same one, and the ranks read it only while they wait,
never on the hot path. The node agent writes ``<slot dir>/restart.order`` atomically (a temporary file renamed into
place, 0600, in the job's private 0700 directory, the slots' own trust); a rank reads it with :func:`read_order`.

Format: one JSON object ``{"v": 1, "generation": G, "env": {NAME: value or null}}``. ``generation`` counts the
restarts of a launch (the ranks start in generation 0; a replacement rank is started in the order's generation);
``env`` is what changes for the new generation: the rendezvous (``MASTER_ADDR``, ``MASTER_PORT``, ``WORLD_SIZE``)
and where to resume (the checkpoint, the memory snapshot, the launch tag, the steps to skip); null removes a
variable. Only the names in :data:`ORDER_ENV` are accepted: an order cannot reach anything else in the rank's
environment. :func:`parse_order` raises only :class:`OrderError` (fuzzed). Stdlib only: imported by every rank.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

ORDER_FILE = "restart.order"
ORDER_VERSION = 1
MAX_ORDER_BYTES = 64 * 1024
MAX_VALUE_CHARS = 4096
MAX_GENERATION = 2**31 - 1
ENV_GENERATION = "SUPERVISOR_GENERATION"  # a replacement rank starts in the generation it joins
ENV_WARM = (
    "SUPERVISOR_WARM_RESTART"  # "1": the supervisor gives restart orders (else a failure ends the process)
)
ENV_WAIT_S = "SUPERVISOR_RESTART_WAIT_S"  # how long a failed rank waits for its order before it gives up

# What an order may set or unset in a rank's environment: the rendezvous and the resume variables the launcher sets
# (supervisor.driver.launcher; the memory tier's names are supervisor.checkpoint.memory's, checked by a test).
ORDER_ENV = frozenset({
    "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
    "SUPERVISOR_RESUME_FROM", "SUPERVISOR_RESUME_MEMORY_STEP", "SUPERVISOR_RESUME_MEMORY_LAUNCH",
    "SUPERVISOR_RESUME_MEMORY_FLUSHED", "SUPERVISOR_LAUNCH", "SUPERVISOR_SKIP_STEPS",
})  # fmt: skip


# A standby process taking over a rank (client/standby.py) also gets the rank's identity: torch's variables, and
# Slurm's for its task in the launch's step (supervisor.driver.task_identity.NAMES, checked by a test), which srun
# gave the standby's own one-task step as rank 0 of 1; under ``srun torchrun`` the variables torchrun gives a
# worker instead (supervisor.driver.torchrun_worker.worker_identity, checked by a test).
ASSIGN_ENV = ORDER_ENV | frozenset({"RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE"}) | frozenset({
    "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "TORCHELASTIC_RESTART_COUNT",
}) | frozenset({
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES",
    "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
})  # fmt: skip


class OrderError(ValueError):
    """A restart order that is not one (malformed, too big, a name it may not set)."""


@dataclass(frozen=True)
class RestartOrder:
    generation: int
    env: dict[str, str | None] = field(default_factory=dict)

    def apply(self, environ: dict[str, str] | os._Environ[str]) -> None:
        """Set the order's variables in ``environ`` (``os.environ``), and the generation."""
        for name, value in self.env.items():
            if value is None:
                environ.pop(name, None)
            else:
                environ[name] = value
        environ[ENV_GENERATION] = str(self.generation)


def order_path(slot_dir: str | os.PathLike[str]) -> Path:
    return Path(slot_dir) / ORDER_FILE


def parse_order(data: bytes, allowed: frozenset[str] = ORDER_ENV) -> RestartOrder:
    """The order in ``data`` (the file's bytes); :class:`OrderError` names what is wrong. ``allowed``: the
    variables it may set (:data:`ASSIGN_ENV` for a standby's assignment)."""
    if len(data) > MAX_ORDER_BYTES:
        raise OrderError(f"restart order of {len(data)} bytes (at most {MAX_ORDER_BYTES})")
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise OrderError(f"restart order is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != ORDER_VERSION:
        raise OrderError(f"restart order is not a version {ORDER_VERSION} object")
    generation = doc.get("generation")
    if type(generation) is not int or not 1 <= generation <= MAX_GENERATION:
        raise OrderError(
            f"restart order's generation {generation!r} is not an integer in 1..{MAX_GENERATION}"
        )
    env = doc.get("env", {})
    if not isinstance(env, dict):
        raise OrderError("restart order's env is not an object")
    for name, value in env.items():
        if name not in allowed:
            raise OrderError(f"restart order may not set {name!r}")
        if value is not None and (
            not isinstance(value, str) or len(value) > MAX_VALUE_CHARS or "\0" in value
        ):
            raise OrderError(
                f"restart order's {name} is not a string of at most {MAX_VALUE_CHARS} characters"
            )
    return RestartOrder(generation, dict(env))


def read_order(slot_dir: str | os.PathLike[str], name: str = ORDER_FILE,
               allowed: frozenset[str] = ORDER_ENV) -> RestartOrder | None:  # fmt: skip
    """The order in the slot directory (``name``: a standby's assignment file), or None when there is none or it
    cannot be read as one (a rank waits on, and gives up at its deadline: a bad order is no order)."""
    try:
        with open(Path(slot_dir) / name, "rb") as f:  # noqa: PTH123 - the bytes, bounded
            data = f.read(MAX_ORDER_BYTES + 1)
        return parse_order(data, allowed)
    except (OSError, OrderError):
        return None


def encode_order(order: RestartOrder, allowed: frozenset[str] = ORDER_ENV) -> bytes:
    """The file's bytes for ``order`` (checked: what :func:`parse_order` refuses is never written)."""
    data = json.dumps({"v": ORDER_VERSION, "generation": order.generation, "env": order.env}, sort_keys=True).encode()
    parse_order(data, allowed)
    return data


def write_order(slot_dir: str | os.PathLike[str], order: RestartOrder, name: str = ORDER_FILE,
                allowed: frozenset[str] = ORDER_ENV) -> Path:  # fmt: skip
    """Write ``order`` into the slot directory atomically (0600) as ``name`` (a standby's assignment file: the rank's
    identity ``allowed`` too): a rank never reads half an order."""
    data = encode_order(order, allowed)
    target = Path(slot_dir) / name
    tmp = target.with_name(f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)
    return target

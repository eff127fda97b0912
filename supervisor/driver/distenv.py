"""The distributed environment of every training launch: torch's ``env://`` variables, and torchrun's.

Launch-wide (the same for every task, set in srun's environment): ``MASTER_ADDR`` (the first node of this launch),
``MASTER_PORT`` (chosen free for this launch: a relaunch in the same allocation never meets the last launch's
TIME_WAIT sockets or its stale store), ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``; and torchrun's defaults (``PET_*``,
read by ``torchrun`` when its flag is not given): a c10d rendezvous on ``MASTER_ADDR:MASTER_PORT`` with an id of
this launch, ``--nnodes`` of this launch and ``--max-restarts=0`` (restarts belong to the supervisor).

Per task (from srun's layout): ``RANK=$SLURM_PROCID``, ``LOCAL_RANK=$SLURM_LOCALID``, ``NODE_RANK=$SLURM_NODEID``,
exported by a fixed shell text before ``exec`` of the user's program, ``/bin/sh -c TEXT sh ARGV...``: the user's
argv stays separate argv entries, never shell text, and the ``exec`` keeps the task's pid. When the ranks were
moved (``placed``: SLURM_HOSTFILE puts ``tasks_per_node`` consecutive ranks on each node, rank 0's node first)
``NODE_RANK`` is ``RANK // LOCAL_WORLD_SIZE``, the node's place in rank order, because ``SLURM_NODEID`` is its
place in Slurm's sorted node list, which the hostfile does not change. For torchrun's static rendezvous (the only
one that reads ``--node-rank``) ``PET_NODE_RANK`` is exported the same way.

A variable the user set (in the environment ``supervise`` runs in) is never overridden. Pure core (``plan``,
``shim``, ``choose_port``); the edge (``pick_port``) only tries a bind on this host.
"""

from __future__ import annotations

import ipaddress
import random
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

# Per task: the variable and the srun variable it copies.
PER_TASK = (("RANK", "SLURM_PROCID"), ("LOCAL_RANK", "SLURM_LOCALID"), ("NODE_RANK", "SLURM_NODEID"))
_NODE_RANK_FLAG = (("PET_NODE_RANK", "SLURM_NODEID"),)  # torchrun's --node-rank, as NODE_RANK
LAUNCH_WIDE = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
TORCHRUN = ("PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_NNODES", "PET_MAX_RESTARTS")

# Ports are drawn below Linux's default ephemeral range (32768-60999), so no outgoing connection of the nodes
# holds one, and above the common service ports.
PORT_LOW, PORT_HIGH = 15000, 32767
PORT_TRIES = 64


@dataclass(frozen=True)
class DistEnv:
    """What one launch exports: ``env`` for srun's environment, ``per_task`` names the shim exports;
    ``placed``: tasks per node when a hostfile places the ranks (NODE_RANK from RANK), else 0."""

    env: dict[str, str] = field(default_factory=dict)
    per_task: tuple[str, ...] = ()
    placed: int = 0

    def wrap(self, command: Sequence[str]) -> list[str]:
        return shim(self.per_task, command, self.placed)


def static_rendezvous(command: Sequence[str], user_env: Mapping[str, str]) -> bool:
    """Whether torchrun in ``command`` is asked for the static rendezvous (``--rdzv-backend=static``, or
    ``PET_RDZV_BACKEND=static`` set by the user): the only backend that reads ``--node-rank``."""
    flags = ("--rdzv-backend", "--rdzv_backend")
    for i, arg in enumerate(command):
        name, eq, value = arg.partition("=")
        if name in flags and (value if eq else (command[i + 1] if i + 1 < len(command) else "")) == "static":
            return True
    return user_env.get("PET_RDZV_BACKEND") == "static"


LAUNCHER_NAMES = ("torchrun", "torch.distributed.run", "torch.distributed.launch")


def runs_torchrun(command: Sequence[str]) -> bool:
    """Whether ``command`` starts torchrun (``torchrun``, ``python -m torch.distributed.run``, ...)."""
    return any(a.rsplit("/", 1)[-1] in LAUNCHER_NAMES for a in command)


def plain_python(command: Sequence[str]) -> bool:
    """Whether ``command`` is a Python interpreter running a program that is not torchrun (``python train.py``,
    ``python -m pkg.train``): its log then holds no torchrun report lines, and the log digest need not look for
    them. A shell script or anything else may run torchrun inside: False."""
    if not command or runs_torchrun(command):
        return False
    return re.fullmatch(r"python[0-9.]*", command[0].rsplit("/", 1)[-1]) is not None


def standby_command(command: Sequence[str]) -> list[str] | None:
    """The command of a standby rank for the training ``command`` (``client/standby.py``): the same interpreter
    running ``-m supervisor.client.standby -- SCRIPT ARGS``; None when ``command`` is not ``python SCRIPT ...`` or
    ``python -m MODULE ...`` (interpreter options, a wrapper script, torchrun: a standby cannot take it over)."""
    if not plain_python(command) or len(command) < 2:
        return None
    target = list(command[1:])
    if target[0] == "-m" and len(target) >= 2 or not target[0].startswith("-"):
        return [command[0], "-m", "supervisor.client.standby", "--", *target]
    return None


def torchrun_restarts_on(command: Sequence[str], user_env: Mapping[str, str]) -> bool:
    """Whether ``command`` runs torchrun with its own restarts turned on: ``--max-restarts N`` (or
    ``--max_restarts``) with N > 0, else the user's ``PET_MAX_RESTARTS`` > 0 (the supervisor's default is 0)."""
    if not runs_torchrun(command):
        return False
    flags = ("--max-restarts", "--max_restarts")
    value = user_env.get("PET_MAX_RESTARTS", "0")
    for i, arg in enumerate(command):
        name, eq, given = arg.partition("=")
        if name in flags:
            value = given if eq else (command[i + 1] if i + 1 < len(command) else "0")
            break
        if not arg.startswith("-") and i > 0 and command[i - 1] not in flags and arg.endswith(".py"):
            break  # the training script: what follows are its own arguments
    return value.strip().isdigit() and int(value) > 0


def plan(
    nodes: Sequence[str], tasks_per_node: int, addresses: Mapping[str, str], port: int,
    user_env: Mapping[str, str], run_id: str, *, placed: bool = False, node_rank_flag: bool = False,
) -> DistEnv:  # fmt: skip
    """The launch's variables, leaving out every one ``user_env`` already has (the user's choice wins).
    ``placed``: a hostfile puts the ranks in ``nodes`` order (moved ranks); ``node_rank_flag``: also export
    torchrun's ``PET_NODE_RANK`` (its static rendezvous, ``static_rendezvous``)."""
    if not nodes or tasks_per_node < 1:
        raise ValueError("a launch has at least one node and one task per node")
    addr = addresses.get(nodes[0]) or nodes[0]
    wanted = {
        "MASTER_ADDR": addr,
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(len(nodes) * tasks_per_node),
        "LOCAL_WORLD_SIZE": str(tasks_per_node),
        "PET_RDZV_BACKEND": "c10d",
        "PET_RDZV_ENDPOINT": f"{_host_for_endpoint(user_env.get('MASTER_ADDR') or addr)}:"
                             f"{user_env.get('MASTER_PORT') or port}",
        "PET_RDZV_ID": run_id,
        "PET_NNODES": str(len(nodes)),
        "PET_MAX_RESTARTS": "0",
    }  # fmt: skip
    env = {k: v for k, v in wanted.items() if k not in user_env}
    per_task = tuple(name for name, _ in (*PER_TASK, *(_NODE_RANK_FLAG if node_rank_flag else ())) if name not in user_env)
    return DistEnv(env, per_task, tasks_per_node if placed else 0)


# PyTorch's flight recorder: a record of each process group's recent collectives, dumped on an NCCL timeout
# (driver/flight_dumps.py reads the dumps: which rank the others wait for). 2,000 entries is torch's own suggestion.
FLIGHT_RECORDER_ENTRIES = "2000"


def flight_recorder_env(dump_prefix: str, user_env: Mapping[str, str]) -> dict[str, str]:
    """The flight recorder on, dumping on a collective timeout to ``dump_prefix<RANK>`` (torch's variables of
    2.4-2.6 and of 2.7+); a variable the user set (``TORCH_NCCL_TRACE_BUFFER_SIZE=0`` too) is left alone."""
    wanted = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": FLIGHT_RECORDER_ENTRIES,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": dump_prefix,
        "TORCH_FR_DUMP_TEMP_FILE": dump_prefix,
    }
    return {k: v for k, v in wanted.items() if k not in user_env}


def shim(per_task: Sequence[str], command: Sequence[str], placed: int = 0) -> list[str]:
    """``command`` run by ``/bin/sh -c`` after exporting ``per_task`` from srun's variables; the shell text is
    fixed (built from the constant tables and the integer ``placed``), ``command`` follows as separate argv
    entries (``"$@"``). ``placed`` > 0: the node rank is ``SLURM_PROCID / placed`` (a hostfile's block layout)."""
    if not per_task:
        return list(command)
    source = {name: f'"${var}"' for name, var in (*PER_TASK, *_NODE_RANK_FLAG)}
    if placed > 0:
        node_rank = f'"$((SLURM_PROCID / {int(placed)}))"'
        source.update(NODE_RANK=node_rank, PET_NODE_RANK=node_rank)
    exports = " ".join(f"{name}={source[name]}" for name in per_task)  # names from the tables only
    return ["/bin/sh", "-c", f'export {exports}; exec "$@"', "sh", *command]


def choose_port(candidates: Iterable[int], is_free: Callable[[int], bool], avoid: Iterable[int] = ()) -> int:
    """The first candidate not in ``avoid`` (ports of this allocation's earlier launches) that ``is_free``
    accepts; if none is accepted, the first candidate not avoided (a remote master cannot be probed)."""
    avoided = set(avoid)
    fallback = None
    for port in candidates:
        if port in avoided:
            continue
        if fallback is None:
            fallback = port
        if is_free(port):
            return port
    if fallback is None:
        raise ValueError("no port candidate left")
    return fallback


def candidates(rng: random.Random, n: int = PORT_TRIES) -> Iterator[int]:
    for _ in range(n):
        yield rng.randint(PORT_LOW, PORT_HIGH)


def _host_for_endpoint(addr: str) -> str:
    try:
        return f"[{addr}]" if ipaddress.ip_address(addr).version == 6 else addr
    except ValueError:
        return addr  # a host name


# --------------------------------------------------------------------------------------------------- edge
def is_local(addr: str) -> bool:
    """Whether ``addr`` is this host (loopback, or an address a socket can bind here)."""
    try:
        ip = ipaddress.ip_address(socket.gethostbyname(addr))
    except (OSError, ValueError):
        return False
    if ip.is_loopback:
        return True
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((str(ip), 0))
        return True
    except OSError:
        return False


def port_free(port: int) -> bool:
    """Whether a TCP listener could bind ``port`` on every address here now. Without SO_REUSEADDR, so a port
    with connections in TIME_WAIT counts as taken."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", port))
        return True
    except OSError:
        return False


def pick_port(master_addr: str, avoid: Iterable[int] = (), rng: random.Random | None = None) -> int:
    """A port for this launch's master: probed when the master is this host, else a fresh random one."""
    rng = rng or random.SystemRandom()
    probe = port_free if is_local(master_addr) else (lambda _port: True)
    return choose_port(candidates(rng), probe, avoid)

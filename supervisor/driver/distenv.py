"""The distributed environment of every training launch: torch's ``env://`` variables, and torchrun's.

Launch-wide (the same for every task, set in srun's environment): ``MASTER_ADDR`` (the first node of this launch),
``MASTER_PORT`` (chosen free for this launch: a relaunch in the same allocation never meets the last launch's
TIME_WAIT sockets or its stale store), ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``; and torchrun's defaults (``PET_*``,
read by ``torchrun`` when its flag is not given): a c10d rendezvous on ``MASTER_ADDR:MASTER_PORT`` with an id of
this launch, ``--nnodes`` of this launch and ``--max-restarts=0`` (restarts belong to the supervisor).

Per task (from srun's layout): ``RANK=$SLURM_PROCID``, ``LOCAL_RANK=$SLURM_LOCALID``, ``NODE_RANK=$SLURM_NODEID``,
exported by a fixed shell text before ``exec`` of the user's program, ``/bin/sh -c TEXT sh ARGV...``: the user's
argv stays separate argv entries, never shell text, and the ``exec`` keeps the task's pid.

A variable the user set (in the environment ``supervise`` runs in) is never overridden. Pure core (``plan``,
``shim``, ``choose_port``); the edge (``pick_port``) only tries a bind on this host.
"""

from __future__ import annotations

import ipaddress
import random
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

# Per task: the variable and the srun variable it copies.
PER_TASK = (("RANK", "SLURM_PROCID"), ("LOCAL_RANK", "SLURM_LOCALID"), ("NODE_RANK", "SLURM_NODEID"))
LAUNCH_WIDE = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "LOCAL_WORLD_SIZE")
TORCHRUN = ("PET_RDZV_BACKEND", "PET_RDZV_ENDPOINT", "PET_RDZV_ID", "PET_NNODES", "PET_MAX_RESTARTS")

# Ports are drawn below Linux's default ephemeral range (32768-60999), so no outgoing connection of the nodes
# holds one, and above the common service ports.
PORT_LOW, PORT_HIGH = 15000, 32767
PORT_TRIES = 64


@dataclass(frozen=True)
class DistEnv:
    """What one launch exports: ``env`` for srun's environment, ``per_task`` names the shim exports."""

    env: dict[str, str] = field(default_factory=dict)
    per_task: tuple[str, ...] = ()

    def wrap(self, command: Sequence[str]) -> list[str]:
        return shim(self.per_task, command)


def plan(
    nodes: Sequence[str], tasks_per_node: int, addresses: Mapping[str, str], port: int,
    user_env: Mapping[str, str], run_id: str,
) -> DistEnv:  # fmt: skip
    """The launch's variables, leaving out every one ``user_env`` already has (the user's choice wins)."""
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
    per_task = tuple(name for name, _ in PER_TASK if name not in user_env)
    return DistEnv(env, per_task)


def shim(per_task: Sequence[str], command: Sequence[str]) -> list[str]:
    """``command`` run by ``/bin/sh -c`` after exporting ``per_task`` from srun's variables; the shell text is
    fixed (built from the constant table), ``command`` follows as separate argv entries (``"$@"``)."""
    if not per_task:
        return list(command)
    source = dict(PER_TASK)
    exports = " ".join(f'{name}="${source[name]}"' for name in per_task)  # names from PER_TASK only
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

"""What torchrun runs as each of its workers, read from the training command: how a warm restart starts a worker of
a ``srun torchrun`` launch again without a torchrun.

WHY: under ``srun torchrun`` a task is a node's torchrun and the ranks are its workers. When one worker dies, its
torchrun (``--max-restarts 0``, the supervisor's default) stops the node's other workers and exits; the other nodes'
torchruns and workers go on, and their workers (inside ``client.restartable``) wait in their processes. A new
torchrun on the node cannot join them: its rendezvous would make every other torchrun restart its workers
(torch.distributed.elastic: a node waiting to join restarts the group). So the node's workers are started again as
torchrun would start them, ``PYTHON -u SCRIPT ARGS`` (``-m MODULE``; ``--no-python``: the program itself) with the
variables torchrun gives a worker, each as its own one-task step, and rendezvous with the waiting ones.

Pure, except :func:`interpreter_of` (reads the torchrun script's first line).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LAUNCHERS = ("torchrun", "torch.distributed.run")
# torchrun's options that take no value (torch.distributed.run's parser, torch 2.4-2.13); every other one takes one.
FLAGS = frozenset({"--standalone", "-m", "--module", "--no-python", "--no_python", "--run-path", "--run_path",
                   "--virtual-local-rank", "--virtual_local_rank"})  # fmt: skip
VALUED = frozenset({"--nnodes", "--nproc-per-node", "--nproc_per_node", "--rdzv-backend", "--rdzv_backend",
                    "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-id", "--rdzv_id", "--rdzv-conf", "--rdzv_conf",
                    "--max-restarts", "--max_restarts", "--monitor-interval", "--monitor_interval", "--start-method",
                    "--start_method", "--event-log-handler", "--event_log_handler", "--role", "--log-dir",
                    "--log_dir", "-r", "--redirects", "-t", "--tee", "--local-ranks-filter", "--local_ranks_filter",
                    "--duplicate-stdout-filters", "--duplicate_stdout_filters", "--duplicate-stderr-filters",
                    "--duplicate_stderr_filters", "--node-rank", "--node_rank", "--master-addr", "--master_addr",
                    "--master-port", "--master_port", "--local-addr", "--local_addr", "--logs-specs", "--logs_specs",
                    "--numa-binding", "--numa_binding", "--signals-to-handle", "--signals_to_handle",
                    "--shutdown-timeout", "--shutdown_timeout"})  # fmt: skip


@dataclass(frozen=True)
class Worker:
    """A torchrun launch's worker: ``argv`` without the interpreter (``-u SCRIPT ARGS``; with ``python`` False the
    program itself), ``nproc`` workers per node."""

    argv: tuple[str, ...]
    nproc: int
    python: bool = True
    launcher_at: int = 0  # where torchrun is in the command: 0 the ``torchrun`` script, 2 ``python -m torch...``


def parse(command: Sequence[str], user_env: Mapping[str, str]) -> Worker | None:
    """The worker of ``torchrun [OPTIONS] SCRIPT ARGS`` or ``python -m torch.distributed.run [OPTIONS] SCRIPT
    ARGS``; None when the command is not one of those, or is one torchrun's workers cannot be read from (an option
    this does not know, ``--run-path``, a per-node count such as ``gpu`` or ``auto``)."""
    if command and os.path.basename(command[0]) == "torchrun":
        at = 0
    elif len(command) > 2 and command[1] == "-m" and command[2] in LAUNCHERS and \
            os.path.basename(command[0]).startswith("python"):  # fmt: skip
        at = 2
    else:
        return None
    nproc = user_env.get("PET_NPROC_PER_NODE", "1")
    module = no_python = False
    i = at + 1
    while i < len(command):
        name, eq, value = command[i].partition("=")
        if not name.startswith("-"):
            break
        if name in FLAGS and not eq:
            module |= name in ("-m", "--module")
            no_python |= name in ("--no-python", "--no_python")
            if name in ("--run-path", "--run_path"):
                return None
            i += 1
        elif name in VALUED:
            if not eq:
                if i + 1 >= len(command):
                    return None
                value = command[i + 1]
            if name in ("--nproc-per-node", "--nproc_per_node"):
                nproc = value
            i += 1 if eq else 2
        else:
            return None  # an option we cannot place (an abbreviation, a newer torchrun's): no guess
    if i >= len(command) or not nproc.isdigit() or int(nproc) < 1 or (module and no_python):
        return None
    script, args = command[i], tuple(command[i + 1 :])
    if no_python:
        return Worker((script, *args), int(nproc), python=False, launcher_at=at)
    return Worker(("-u", *(("-m",) if module else ()), script, *args), int(nproc), launcher_at=at)


def interpreter_of(command: Sequence[str], worker: Worker, user_env: Mapping[str, str]) -> str | None:
    """The Python torchrun runs its workers with (``PYTHON_EXEC``, else its own): ``python`` of ``python -m
    torch.distributed.run``, else the interpreter on the ``torchrun`` script's first line (``#!``). None: not
    found (then no worker is started without torchrun)."""
    if user_env.get("PYTHON_EXEC"):
        return user_env["PYTHON_EXEC"]
    if worker.launcher_at == 2:
        return command[0]
    found = shutil.which(command[0], path=user_env.get("PATH"))
    if found is None:
        return None
    try:
        with open(found, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode(errors="replace").split()
    if not words:
        return None
    if os.path.basename(words[0]) == "env" and len(words) > 1:  # #!/usr/bin/env python3
        return shutil.which(words[1], path=user_env.get("PATH"))
    return words[0] if Path(words[0]).name.startswith("python") else None


def worker_command(command: Sequence[str], user_env: Mapping[str, str]) -> tuple[list[str], int] | None:
    """The command line of one worker of the torchrun ``command`` and its workers per node; None when it cannot
    be known (module docstring)."""
    worker = parse(command, user_env)
    if worker is None:
        return None
    if not worker.python:
        return list(worker.argv), worker.nproc
    python = interpreter_of(command, worker, user_env)
    return ([python, *worker.argv], worker.nproc) if python else None


def standby_command(worker: Sequence[str]) -> list[str] | None:
    """The command of a standby rank (``client/standby.py``) for torchrun's worker command line ``worker``
    (:func:`worker_command`: ``PYTHON -u SCRIPT ARGS`` or ``PYTHON -u -m MODULE ARGS``): torchrun's interpreter
    running ``-u -m supervisor.client.standby -- SCRIPT ARGS``, which on its assignment runs the script as
    torchrun's worker would. None for a worker that is not a Python program (``--no-python``)."""
    if len(worker) < 3 or worker[1] != "-u" or not os.path.basename(worker[0]).startswith("python"):
        return None
    return [worker[0], "-u", "-m", "supervisor.client.standby", "--", *worker[2:]]


def worker_identity(rank: int, world: int, nproc: int, nodes: int) -> dict[str, str]:
    """The variables torchrun gives worker ``rank`` of a homogeneous launch (``nproc`` per node on ``nodes``
    nodes; its group rank is its node's place in the rendezvous, ranks ``group * nproc`` on): the worker then
    rendezvous through ``MASTER_ADDR:MASTER_PORT`` as rank 0's own store (``TORCHELASTIC_USE_AGENT_STORE`` False:
    no torchrun hosts one for it)."""
    group = rank // nproc
    return {"RANK": str(rank), "LOCAL_RANK": str(rank % nproc), "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(group), "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(world), "GROUP_WORLD_SIZE": str(nodes), "NODE_RANK": str(group),
            "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCHELASTIC_RESTART_COUNT": "0"}  # fmt: skip

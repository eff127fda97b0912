"""Find this node's training ranks that have no slot (they never call the client), from /proc.

WHY: ranks without heartbeats must still be watched for what the process table shows: stopped (SIGSTOP, a
debugger), zombie, gone. A rank is a process of this job and node, launched by srun (``SLURM_STEP_ID`` set,
not the agents' own step) with a ``SLURM_PROCID``; its children (data loader workers) inherit the same variables,
so only the top-most matching process of each rank is taken.

Under ``srun torchrun`` the step's task on a node is torchrun, and the ranks are its workers (grandchildren of
the srun task): a worker carries torchrun's ``TORCHELASTIC_RUN_ID`` and its global ``RANK``, and is taken under
that rank; torchrun itself (a task that is a worker's parent, or whose command line is torchrun's, before its
workers start) is the launcher, never a rank. A rank a warm restart started again runs as the only task of its own
step (``SLURM_PROCID`` 0): it carries ``SUPERVISOR_GENERATION`` and its ``RANK``, and is taken under that rank.
"""

from __future__ import annotations

import os
from pathlib import Path

from slurm.env import is_srun_step

PROC = Path("/proc")
HELPER_ENV = "SUPERVISOR_HELPER_STEP"  # set in the environment of the supervisor's own job steps (preflight)


def _environ(pid: str) -> dict[bytes, bytes]:
    try:
        raw = (PROC / pid / "environ").read_bytes()
    except OSError:
        return {}
    out: dict[bytes, bytes] = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep and (key.startswith((b"SLURM", b"SUPERVISOR")) or key in (b"RANK", b"TORCHELASTIC_RUN_ID")):
            out[key] = value
    return out


def _ppid(pid: str) -> str:
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[1]


LAUNCHERS = (b"torchrun", b"torch.distributed.run", b"torch.distributed.launch")


def _is_launcher_cmdline(pid: str) -> bool:
    """torchrun's own process: ``torchrun ...``, ``python .../torchrun ...``, ``python -m torch.distributed.run``."""
    try:
        argv = (PROC / pid / "cmdline").read_bytes().split(b"\0")[:3]
    except OSError:
        return False
    return any(a.rsplit(b"/", 1)[-1] in LAUNCHERS for a in argv)


def find_ranks(job: str, node: str, own_step: str | None = None) -> dict[int, int]:
    """rank -> pid of the job's ranks on ``node``: its step tasks (other than the agents' own step), or the
    torchrun workers under them."""
    want_job, want_node = job.encode(), node.encode()
    mine = str(os.getuid())
    found: dict[str, int] = {}  # pid -> rank (SLURM_PROCID) of srun's tasks and their children
    workers: dict[str, int] = {}  # pid -> rank (RANK) of torchrun's workers and their children
    for entry in PROC.iterdir():
        pid = entry.name
        if not pid.isdigit():
            continue
        try:
            if str(entry.stat().st_uid) != mine and mine != "0":
                continue
        except OSError:
            continue
        env = _environ(pid)
        if env.get(b"SLURM_JOB_ID") != want_job or env.get(b"SLURMD_NODENAME", want_node) != want_node:
            continue
        if HELPER_ENV.encode() in env:  # the supervisor's own short steps (the preflight), not training ranks
            continue
        step, procid = env.get(b"SLURM_STEP_ID"), env.get(b"SLURM_PROCID")
        # not the batch script (26.05 gives it SLURM_STEP_ID=-5 and SLURM_PROCID=0: the supervisor would be rank 0)
        step_text = None if step is None else step.decode(errors="replace")
        if procid is None or not procid.isdigit() or not is_srun_step(step_text) or step_text == (own_step or ""):
            continue
        global_rank = env.get(b"RANK", b"")
        if b"TORCHELASTIC_RUN_ID" in env and global_rank.isdigit():
            workers[pid] = int(global_rank)  # a torchrun worker: its global rank
        elif b"SUPERVISOR_GENERATION" in env and global_rank.isdigit():
            found[pid] = int(global_rank)  # a rank a warm restart started again: its own one-task step (PROCID 0)
        else:
            found[pid] = int(procid)
    parents = {pid: _ppid(pid) for pid in (*found, *workers)}
    # torchrun: the parent of a top-most worker (a worker's own children carry the worker variables too)
    launchers = {parents[pid] for pid in workers if parents[pid] not in workers}
    launchers |= {pid for pid in found if _is_launcher_cmdline(pid)}
    top: dict[int, int] = {}
    for pid, rank in (*found.items(), *workers.items()):
        above = parents[pid] in workers or (pid not in workers and parents[pid] in found)
        if pid in launchers or above:
            continue  # torchrun itself; a child of a rank (a data-loader worker, a shell wrapper's child)
        if rank not in top or int(pid) < top[rank]:
            top[rank] = int(pid)
    return top

"""Find this node's training ranks that have no slot (they never call the client), from /proc.

WHY: ranks without heartbeats must still be watched for what the process table shows: stopped (SIGSTOP, a
debugger), zombie, gone. A rank is a process of this job and node, launched by srun (``SLURM_STEP_ID`` set,
not the agents' own step) with a ``SLURM_PROCID``; its children (data loader workers) inherit the same variables,
so only the top-most matching process of each rank is taken.
"""

from __future__ import annotations

import os
from pathlib import Path

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
        if sep and key.startswith((b"SLURM", b"SUPERVISOR")):
            out[key] = value
    return out


def _ppid(pid: str) -> str:
    try:
        stat = (PROC / pid / "stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[1]


def find_ranks(job: str, node: str, own_step: str | None = None) -> dict[int, int]:
    """rank -> pid of the job's step tasks on ``node`` (other than the agents' own step)."""
    want_job, want_node = job.encode(), node.encode()
    mine = str(os.getuid())
    found: dict[str, int] = {}  # pid -> rank
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
        if step is None or procid is None or not procid.isdigit() or step.decode() == (own_step or ""):
            continue
        found[pid] = int(procid)
    top: dict[int, int] = {}
    for pid, rank in found.items():
        if _ppid(pid) in found:  # a child of another task process (a worker, a shell wrapper's child)
            continue
        if rank not in top or int(pid) < top[rank]:
            top[rank] = int(pid)
    return top

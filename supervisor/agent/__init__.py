"""The node agent: one per node, started as an overlapping srun step (``python -m supervisor.agent``).

WHY a separate per-node process: it outlives training-step restarts, watches rank processes that never
call the client (pid liveness, stopped/zombie state, CPU progress), samples the shared-memory slots of
those that do, and sends one compact authenticated summary per node to the supervisor, so the batch host
never opens 16k connections or polls 131k processes.  Stdlib + psutil only: no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

SLOT_DIR_ENV = "SUPERVISOR_SLOT_DIR"


def slot_dir_for(job_id: str, uid: int | None = None) -> Path:
    """The node-local slot directory of a job: ``/dev/shm/supervisor-<jobid>-<uid>`` (what ranks get as
    ``SUPERVISOR_SLOT_DIR``)."""
    return Path("/dev/shm") / f"supervisor-{job_id}-{os.getuid() if uid is None else uid}"


def expand_slot_dir(template: str, *, job: str, node: str) -> Path:
    """Replace ``{node}``, ``{job}`` and ``{uid}`` in a slot-dir setting: one srun command line serves every
    node, and several slurmd sharing one host (the local test cluster) need one slot dir per node."""
    return Path(template.replace("{node}", node).replace("{job}", job).replace("{uid}", str(os.getuid())))

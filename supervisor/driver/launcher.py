"""Launch and stop the job steps the supervisor owns: the node agents and the training step.

The agents run as one overlapping step (one task per node) so they outlive training-step restarts; the training
step is relaunched in the same allocation after a crash or hang. Steps are named (``train-<n>``) so the
supervisor can find a step's id and kill it on every node at once with scancel, even when ranks are stopped.
All commands are argument lists.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from slurm.client import SlurmClient
from slurm.errors import SlurmError
from supervisor.driver.ports import Process


@dataclasses.dataclass
class Launch:
    """One launch of the training (one srun, a Slurm job step): its number in this attempt (1, 2, ...), the job
    step's name, the srun process, its log and nodes."""

    number: int
    name: str
    proc: Process
    log_path: Path
    started: float
    nodes: tuple[str, ...]
    worker_restarts: bool = False  # torchrun may restart its workers inside the launch (--max-restarts > 0)


def start(argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start a step; its output is appended to ``log_path`` (0600). A new session keeps terminal signals out."""
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
            cwd=cwd or None, start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(fd)


def kill_step(
    slurm: SlurmClient, job_id: str, name: str, proc: Process, wait_s: float = 15.0, background: bool = False
) -> int | None:
    """Kill a job step on every node at once (SIGKILL reaches stopped ranks too) and reap its srun.

    Falls back to signalling srun itself when Slurm no longer lists the step (or cannot be asked). Returns
    srun's exit code. ``background``: the step has a dead node, and scancel waits for that node's answer
    (MessageTimeout, 6 s on the local cluster) although the live nodes got the signal at once: it runs in a
    thread, and srun (which waits for the dead node's tasks forever) is killed after ``wait_s``.
    """

    def cancel() -> None:
        try:
            step_id = slurm.step_ids(job_id).get(name)
            if step_id is not None:
                slurm.cancel_step(step_id, "KILL")
        except SlurmError:
            pass  # the step ended meanwhile, or Slurm did not answer; srun is killed and reaped below either way

    if background:
        threading.Thread(target=cancel, name=f"scancel-{name}", daemon=True).start()
    else:
        cancel()
    deadline = time.monotonic() + wait_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=5)
    return proc.returncode

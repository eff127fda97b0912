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
from slurm.hostlist import compress
from supervisor.driver.ports import Process


@dataclasses.dataclass(frozen=True)
class Layout:
    """How the training step is laid out in the allocation."""

    nodes: tuple[str, ...]  # allocation nodes, in Slurm order
    tasks_per_node: int
    spare_nodes: int = 0  # nodes kept out of the training step, to replace a blamed node without requeueing

    @property
    def train_nodes(self) -> int:
        return len(self.nodes) - self.spare_nodes


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


def agent_argv(
    nodes: Sequence[str], python: str, campaign: Path, supervisor_addr: tuple[str, int], extra: Sequence[str] = ()
) -> list[str]:
    """srun line for the node agents: one task on each node, sharing CPUs with the training, and surviving
    the loss of a node (``--no-kill``) so the other nodes stay watched."""
    n = len(nodes)
    return [
        "srun", "--overlap", f"--nodelist={compress(list(nodes))}", f"--nodes={n}", f"--ntasks={n}",
        "--ntasks-per-node=1", "--job-name=supervisor-agent", "--kill-on-bad-exit=0", "--no-kill",
        "--cpus-per-task=1", "--mem=0", "--quiet",
        python, "-m", "supervisor.agent", "--campaign", str(campaign),
        "--supervisor", f"{supervisor_addr[0]}:{supervisor_addr[1]}", *extra,
    ]  # fmt: skip


def step_nodes(layout: Layout, exclude: Sequence[str] = (), shift: int = 0) -> tuple[str, ...]:
    """The training step's nodes in rank order: the first usable ones (``exclude`` left out), rotated left by
    ``shift`` so that different ranks land on each node (task ``i`` on node ``i // tasks_per_node``)."""
    usable = [n for n in layout.nodes if n not in set(exclude)][: layout.train_nodes]
    k = shift % len(usable) if usable else 0
    return tuple(usable[k:] + usable[:k])


def hostfile_text(nodes: Sequence[str], tasks_per_node: int) -> str:
    """SLURM_HOSTFILE for ``--distribution=arbitrary``: one line per task, in rank order."""
    return "".join(f"{n}\n" for n in nodes for _ in range(tasks_per_node))


def train_argv(
    layout: Layout, command: Sequence[str], launch: int, exclude: Sequence[str] = (), extra: Sequence[str] = (),
    nodelist: Sequence[str] = (), *, arbitrary: bool = False,
) -> list[str]:
    """srun line for the training step, avoiding ``exclude`` (blamed nodes) when the spares allow it. With
    ``nodelist`` the step runs on exactly those nodes (its first one is MASTER_ADDR, see ``distenv``).
    ``arbitrary``: tasks go where SLURM_HOSTFILE says, in its order (the ranks moved to other nodes)."""
    usable = [n for n in layout.nodes if n not in set(exclude)]
    nnodes = min(layout.train_nodes, len(usable))
    # With an arbitrary distribution the hostfile places every task; Slurm 24.11's srun refuses --nodes beside it
    # ("--nodes is incompatible with --distribution=arbitrary"), 22.05 accepted it.
    shape = [] if arbitrary else [f"--nodes={nnodes}", f"--ntasks-per-node={layout.tasks_per_node}"]
    argv = [
        # --overlap: after a node failure Slurm may keep the dead step's CPUs on the survivors booked until the
        # lost node is cleaned up; the relaunch must not wait for that ("Requested nodes are busy").
        "srun", "--overlap", f"--job-name=train-{launch}", *shape, f"--ntasks={nnodes * layout.tasks_per_node}",
        "--kill-on-bad-exit=1", "--mem=0",
        "--label",  # "N: " before each line: log lines name their rank and node (decisions/tasklog.py)
    ]  # fmt: skip
    if nodelist:
        argv.append(f"--nodelist={compress(list(nodelist))}")
    if exclude:
        argv.append(f"--exclude={compress(sorted(set(exclude)))}")
    if arbitrary:
        argv.append("--distribution=arbitrary")
    return [*argv, *extra, *command]


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

"""A cheap "is this node still there?" probe: a tiny overlapping job step, ``srun --overlap -w NODE true``.

It runs inside the job's allocation (``--jobid``), shares the node's CPUs with the training (``--overlap``,
``--mem=0``), and is watched without blocking: :meth:`Probe.result` is polled by the caller's loop. A node
whose slurmd is gone refuses the launch ("Communication connection failure") or never answers; either way the
probe reports it dead, the second once ``timeout_s`` has passed (srun is then killed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slurm import srun

DEFAULT_TIMEOUT_S = 3.0


class ProbeProcess(Protocol):
    returncode: int | None

    def poll(self) -> int | None: ...

    def kill(self) -> None: ...

    def wait(self, timeout: float | None = None) -> int: ...


def _probe_env(env: Mapping[str, str] | None) -> dict[str, str]:
    """The caller's environment without the job-step layout variables a batch step or a task inherits (they
    would override the probe's one-task layout)."""
    base = dict(os.environ if env is None else env)
    for name in ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NNODES",
                 "SLURM_CPUS_PER_TASK", "SLURM_DISTRIBUTION", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_MEM_PER_CPU",
                 "SLURM_MEM_PER_NODE", "SLURM_EXCLUSIVE", "SLURM_GPUS_PER_TASK", "SLURM_ARRAY_TASK_ID"):  # fmt: skip
        base.pop(name, None)
    return base


def start_process(argv: Sequence[str], env: Mapping[str, str] | None = None) -> ProbeProcess:
    return subprocess.Popen(
        list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env=_probe_env(env), start_new_session=True,
    )  # fmt: skip


@dataclass
class Probe:
    node: str
    proc: ProbeProcess
    started: float  # time.monotonic() at start
    timeout_s: float

    def result(self, now: float | None = None) -> tuple[bool, str] | None:
        """None while it runs; (alive, detail) once srun exited or the timeout passed (then srun is killed)."""
        now = time.monotonic() if now is None else now
        code = self.proc.poll()
        if code is not None:
            return (code == 0, "srun true answered" if code == 0 else f"srun exited {code}: {self._stderr()}")
        if now - self.started < self.timeout_s:
            return None
        self.stop()
        return False, f"no answer within {self.timeout_s:.1f}s"

    def _stderr(self) -> str:
        stream = getattr(self.proc, "stderr", None)
        if stream is None:
            return ""
        try:
            text = stream.read(4096).decode(errors="replace")
        except (OSError, ValueError):
            return ""
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return lines[-1][:200] if lines else ""

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        pid = getattr(self.proc, "pid", None)
        try:
            if isinstance(pid, int) and pid > 0:
                os.killpg(pid, signal.SIGKILL)  # srun leads its own session: its helpers go too
            else:
                self.proc.kill()
        except OSError:
            with contextlib.suppress(OSError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=2)
        except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired: srun stuck in D state; let it go
            pass


ProbeStarter = Callable[[str, float], Probe]


def starter(job_id: str | None, start: Callable[[Sequence[str]], ProbeProcess] = start_process) -> ProbeStarter:
    """A function that starts one probe of a node, for ``job_id``'s allocation."""

    def start_probe(node: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Probe:
        return Probe(node, start(srun.probe(node, job_id)), time.monotonic(), timeout_s)

    return start_probe

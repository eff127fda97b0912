"""Rank process state from /proc (via psutil): running, stopped, zombie, gone, and CPU time.

WHY not waitpid: the agent is not the ranks' parent (srun's slurmstepd is), so it cannot learn exit
codes; a vanished pid is reported as ``gone`` and the supervisor takes the code from srun/Slurm.
psutil's ``is_running`` compares the process start time, so a recycled pid is never mistaken for the rank.
"""

from __future__ import annotations

import psutil

from supervisor.heartbeat import wire

_STATUS = {
    psutil.STATUS_RUNNING: wire.ST_RUNNING,
    psutil.STATUS_SLEEPING: wire.ST_SLEEPING,
    psutil.STATUS_IDLE: wire.ST_SLEEPING,
    psutil.STATUS_DISK_SLEEP: wire.ST_DISK,
    psutil.STATUS_STOPPED: wire.ST_STOPPED,
    psutil.STATUS_TRACING_STOP: wire.ST_STOPPED,
    psutil.STATUS_ZOMBIE: wire.ST_ZOMBIE,
    psutil.STATUS_DEAD: wire.ST_GONE,
}


class ProcWatch:
    """Caches one ``psutil.Process`` per pid so start-time checks guard against pid reuse."""

    def __init__(self) -> None:
        self._procs: dict[int, psutil.Process | None] = {}

    def sample(self, pid: int, started_by: float = 0.0) -> tuple[int, float]:
        """(state code, user+system CPU seconds) of ``pid``; ``(ST_GONE, 0.0)`` once it vanished.

        ``started_by``: wall time the rank was known to be alive (its slot's start time); a process with
        that pid created later is a recycled pid, not the rank.
        """
        if pid <= 0:
            return wire.ST_NO_PID, 0.0
        proc = self._procs.get(pid, False)
        if proc is False:
            try:
                proc = psutil.Process(pid)
                if started_by and proc.create_time() > started_by + 1.0:
                    proc = None
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                proc = None
            self._procs[pid] = proc
        if proc is None:
            return wire.ST_GONE, 0.0
        try:
            with proc.oneshot():
                if not proc.is_running():
                    self._procs[pid] = None
                    return wire.ST_GONE, 0.0
                state = _STATUS.get(proc.status(), wire.ST_UNKNOWN)
                times = proc.cpu_times()
            return state, times.user + times.system
        except psutil.NoSuchProcess:
            self._procs[pid] = None
            return wire.ST_GONE, 0.0
        except psutil.AccessDenied:
            return wire.ST_UNKNOWN, 0.0

    def forget_except(self, pids: set[int]) -> None:
        for pid in [p for p in self._procs if p not in pids]:
            del self._procs[pid]

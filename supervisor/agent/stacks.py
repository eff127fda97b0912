"""Stack dumps on request, saved before the kill: the client's faulthandler dump for live ranks that installed
it, py-spy for the ranks that need a stack most and cannot give one themselves.

* A live rank that advertises RANK_FLAG_STACK_DUMPS gets the dump signal (a real-time signal whose default
  action kills the process, so a rank without the client's handler never receives it); faulthandler writes
  every thread's Python stack; the agent waits for the file to settle and saves it.
* A stopped rank (SIGSTOP, a debugger) cannot run a handler, and resuming it (SIGCONT) would change what is
  being diagnosed; py-spy ``--nonblocking`` reads its memory with process_vm_readv, which works on a stopped
  process and leaves it stopped: Python frames only (native unwinding needs ptrace to suspend the process,
  which fails on a stopped one: "Failed to suspend process").
* A rank without the client (or without the handler) gets ``py-spy dump --native`` (Python and native frames;
  py-spy suspends it for a few milliseconds), falling back to ``--nonblocking``.

Every signal is sent through a pidfd opened *before* the process's start time is checked against the rank's
(the slot's start time, or the time the agent discovered the process), so a recycled pid never gets it.
py-spy is the optional ``stacks`` extra; without it, or without ptrace permission, the event says so: which
ranks have no stack, and why, ends up in the journal. Dumps are saved in the campaign dir
(``stacks/<node>-rank<N>-<time>[.pyspy].txt``, 0600); only their path travels to the supervisor.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from supervisor.client.slot import (
    RANK_FLAG_EXITING,
    RANK_FLAG_STACK_DUMPS,
    STACK_DUMP_SIGNAL,
    SlotRecord,
    stacks_path,
)
from supervisor.heartbeat import wire
from supervisor.heartbeat.secret import ensure_private_dir

MAX_DUMP_BYTES = 4 << 20
SETTLE_S = 0.2  # faulthandler writes thread after thread; wait until the file stops growing
START_SLACK_S = 1.0  # clock granularity between /proc start times and the slot's wall clock
AUTO = "auto"
FAULTHANDLER_TIMEOUT_S = 3.0  # a live rank's own dump
PYSPY_TIMEOUT_S = 10.0  # one py-spy run
# The longest one rank's dump can take: py-spy --native, then --nonblocking after it failed (the supervisor waits
# this long, plus transit, before the kill).
MAX_DUMP_S = max(FAULTHANDLER_TIMEOUT_S, 2 * PYSPY_TIMEOUT_S)


@dataclass
class _Pending:
    rank: int
    path: Path
    start: int
    size: int
    changed: float
    deadline: float


@dataclass
class _Spy:
    rank: int
    pid: int
    mode: str  # "native" | "nonblocking"
    stopped: bool
    out: Path
    fh: IO[bytes]
    proc: subprocess.Popen[bytes]
    deadline: float
    tried: list[str] = field(default_factory=list)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


def find_pyspy() -> str | None:
    """py-spy on PATH or next to this interpreter (a venv's bin/)."""
    found = shutil.which("py-spy")
    if found:
        return found
    candidate = Path(sys.executable).with_name("py-spy")
    return str(candidate) if candidate.exists() else None


def process_state(pid: int) -> str | None:
    """'stopped', 'zombie', 'alive', or None when the pid is gone (from /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return {"T": "stopped", "t": "stopped", "Z": "zombie", "X": "zombie"}.get(state, "alive")


def start_time(pid: int) -> float | None:
    """The process's start time (wall clock seconds), or None when it is gone."""
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # noqa: BLE001 - NoSuchProcess, AccessDenied: unknown
        return None


def open_checked(pid: int, started_by: float | None) -> tuple[int | None, str | None]:
    """(pidfd or None where pidfds are unsupported, None) when ``pid`` is still the process that existed at
    ``started_by``; (None, why) when it is gone or was recycled. The pidfd is opened first, so the check and the
    signal concern the same process."""
    pidfd = None
    if hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None, f"pid {pid} is gone"
        except OSError:
            pidfd = None  # old kernel: fall back to kill() right after the check
    started = start_time(pid)
    why = None
    if started is None:
        why = f"pid {pid} is gone"
    elif started_by is not None and started > started_by + START_SLACK_S:
        why = (f"pid {pid} was recycled: the process there started at {started:.0f}, after the rank "
               f"({started_by:.0f}); not signalled")  # fmt: skip
    if why is not None and pidfd is not None:
        os.close(pidfd)
        pidfd = None
    return pidfd, why


def send_checked(pid: int, sig: int, started_by: float | None) -> str | None:
    """Signal ``pid`` only if it is still the same process; None on success, else why not."""
    pidfd, why = open_checked(pid, started_by)
    if why is not None:
        return why
    try:
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, sig)
        else:
            os.kill(pid, sig)
    except OSError as err:
        return f"cannot signal pid {pid}: {err.strerror}"
    finally:
        if pidfd is not None:
            os.close(pidfd)
    return None


class StackDumps:
    def __init__(self, slot_dir: Path, out_dir: Path, node: str, timeout_s: float = FAULTHANDLER_TIMEOUT_S,
                 pyspy: str | None = AUTO, pyspy_timeout_s: float = PYSPY_TIMEOUT_S) -> None:  # fmt: skip
        """``pyspy``: the py-spy executable, ``"auto"`` to look for it, None to never use it."""
        self.slot_dir, self.out_dir, self.node, self.timeout_s = slot_dir, out_dir, node, timeout_s
        self.pyspy = find_pyspy() if pyspy == AUTO else pyspy
        self.pyspy_timeout_s = pyspy_timeout_s
        self.pending: dict[int, _Pending] = {}
        self.spies: dict[int, _Spy] = {}

    @property
    def busy(self) -> bool:
        return bool(self.pending or self.spies)

    def request(self, rank: int, rec: SlotRecord | None, now: float | None = None, *, pid: int | None = None,
                started_by: float | None = None) -> wire.Event | None:  # fmt: skip
        """Ask for one rank's stack; returns a failure event at once if none can be had (else it comes from
        :meth:`poll`). ``pid``/``started_by``: for a rank without a slot, its process as the agent found it
        (``discover.find_ranks``) and a wall time it was known alive."""
        now = time.monotonic() if now is None else now
        if rank in self.pending or rank in self.spies:
            return None
        if rec is not None:
            pid, started_by = rec.pid, rec.start_wall_ns / 1e9 if rec.start_wall_ns > 0 else started_by
        if pid is None or pid <= 0:
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, "no slot for this rank on this node")
        state = process_state(pid)
        if state is None or state == "zombie":
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, f"no stack: the process (pid {pid}) has exited")
        # An exiting interpreter (atexit ran) resets its signal handlers: the dump signal would kill it.
        exiting = rec is not None and bool(rec.rank_flags & RANK_FLAG_EXITING)
        handler = rec is not None and bool(rec.rank_flags & RANK_FLAG_STACK_DUMPS) and not exiting
        if handler and state != "stopped":
            return self._signal(rank, pid, started_by, now)
        why = "the process is stopped (SIGSTOP/debugger)" if state == "stopped" else (
            "the rank is exiting (its handlers are gone)" if exiting else
            "the rank has no stack-dump handler" if rec is not None else "the rank does not use the client")
        if self.pyspy is None:
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, f"no stack: {why}, and py-spy is not installed "
                              "(pip install 'slurm-supervisor[stacks]'); not signalled")  # fmt: skip
        _, bad = open_checked(pid, started_by)
        if bad is not None:
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, f"no stack: {bad}")
        return self._spy(rank, pid, "nonblocking" if state == "stopped" else "native", state == "stopped", now)

    def _signal(self, rank: int, pid: int, started_by: float | None, now: float) -> wire.Event | None:
        path = stacks_path(self.slot_dir, rank)
        start = _size(path)
        why = send_checked(pid, STACK_DUMP_SIGNAL, started_by)
        if why is not None:
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, why)
        self.pending[rank] = _Pending(rank, path, start, start, now, now + self.timeout_s)
        return None

    def _spy(self, rank: int, pid: int, mode: str, stopped: bool, now: float,
             tried: list[str] | None = None) -> wire.Event | None:  # fmt: skip
        assert self.pyspy is not None
        try:
            out = self._new_file(rank, "pyspy.txt")
            fh = open(out, "ab")  # noqa: SIM115 - closed in poll()
        except OSError as err:
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, f"cannot save dump: {err}")
        note = ("native frames unavailable: the process is stopped and py-spy cannot suspend it to unwind"
                if stopped else f"mode {mode}")
        fh.write(f"# py-spy dump of rank {rank}, pid {pid} on {self.node} ({note})\n".encode())
        fh.flush()
        argv = [self.pyspy, "dump", "--pid", str(pid), f"--{mode}"]
        try:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)  # noqa: S603
        except OSError as err:
            fh.close()
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, f"cannot run py-spy: {err}")
        self.spies[rank] = _Spy(rank, pid, mode, stopped, out, fh, proc, now + self.pyspy_timeout_s, tried or [])
        return None

    def poll(self, now: float | None = None) -> list[wire.Event]:
        """Finish dumps whose output settled, whose py-spy ended, or that timed out."""
        now = time.monotonic() if now is None else now
        done = self._poll_faulthandler(now)
        for rank, spy in list(self.spies.items()):
            rc = spy.proc.poll()
            if rc is None and now < spy.deadline:
                continue
            del self.spies[rank]
            if rc is None:
                spy.proc.kill()
                spy.proc.wait()
            err = (spy.proc.stderr.read() if spy.proc.stderr else b"").decode(errors="replace")
            if spy.proc.stderr:
                spy.proc.stderr.close()
            spy.fh.close()
            if rc == 0:
                os.chmod(spy.out, 0o600)
                done.append(wire.Event(wire.EVENT_STACKS_SAVED, rank, str(spy.out)))
                continue
            first = next((line.strip() for line in err.splitlines() if line.strip()), "no output")
            why = f"py-spy --{spy.mode} did not finish within {self.pyspy_timeout_s:g} s" if rc is None else \
                f"py-spy --{spy.mode}: {first}"
            spy.tried.append(why)
            _unlink(spy.out)
            if spy.mode == "native" and process_state(spy.pid) not in (None, "zombie"):
                retry = self._spy(rank, spy.pid, "nonblocking", False, now, spy.tried)
                if retry is None:
                    continue
                done.append(retry)
                continue
            hint = " (ptrace not permitted? needs the same user and kernel.yama.ptrace_scope=0, or CAP_SYS_PTRACE)" \
                if "ermission" in err or "EPERM" in err else ""
            done.append(wire.Event(wire.EVENT_STACKS_FAILED, rank, "no stack: " + "; ".join(spy.tried) + hint))
        return done

    def _poll_faulthandler(self, now: float) -> list[wire.Event]:
        done: list[wire.Event] = []
        for rank, p in list(self.pending.items()):
            size = _size(p.path)
            if size < p.start:  # file replaced by a restarted rank
                p.start = 0
            if size != p.size:
                p.size, p.changed = size, now
                continue
            if size > p.start and now - p.changed >= SETTLE_S:
                done.append(self._save(p))
            elif now >= p.deadline:
                done.append(wire.Event(wire.EVENT_STACKS_FAILED, rank,
                                       f"no dump within {self.timeout_s:g} s (rank stopped or stuck in C code?)"))
            else:
                continue
            del self.pending[rank]
        return done

    def _new_file(self, rank: int, suffix: str) -> Path:
        ensure_private_dir(self.out_dir)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.3f}"[1:]
        out = self.out_dir / f"{self.node}-rank{rank}-{stamp}.{suffix}"
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        os.close(fd)
        return out

    def _save(self, p: _Pending) -> wire.Event:
        try:
            with open(p.path, "rb") as fh:
                fh.seek(p.start)
                data = fh.read(min(p.size - p.start, MAX_DUMP_BYTES))
            out = self._new_file(p.rank, "txt")
            with open(out, "wb") as fh:
                fh.write(data)
        except OSError as err:
            return wire.Event(wire.EVENT_STACKS_FAILED, p.rank, f"cannot save dump: {err}")
        return wire.Event(wire.EVENT_STACKS_SAVED, p.rank, str(out))

    def close(self) -> None:
        for spy in self.spies.values():
            if spy.proc.poll() is None:
                spy.proc.kill()
                spy.proc.wait()
            spy.fh.close()
        self.spies.clear()


def _unlink(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass

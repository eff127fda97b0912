"""Processes of the local cluster: is a recorded daemon alive, start one, stop only what we recorded.

Why so careful: ``kill -0`` reports zombies and recycled pids as alive, and several clusters (the shared one and
developers' private ones) run the same programs on one host. A pid counts as ours only if ``/proc/PID/exe`` is the
expected program and its command line names our config file. We never stop processes by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import psutil


def read_pid(pid_file: Path) -> int | None:
    try:
        text = pid_file.read_text().strip()
    except (FileNotFoundError, PermissionError):
        return None
    return int(text) if text.isdigit() else None


def is_our_process(pid: int, program: Path, args: Sequence[str] = ()) -> bool:
    """True if ``pid`` runs ``program`` (resolved path), is not a zombie, and its argv contains every ``args``."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:  # gone, zombie (exe unreadable) or not ours to inspect
        return False
    exe = exe.removesuffix(" (deleted)")
    if os.path.realpath(exe) != os.path.realpath(program):
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        return False
    argv = {arg.decode(errors="replace") for arg in cmdline}
    return all(a in argv for a in args)


def alive_daemon(pid_file: Path, program: Path, args: Sequence[str] = ()) -> int | None:
    """The pid recorded in ``pid_file`` if that process is still our live daemon, else None."""
    pid = read_pid(pid_file)
    if pid is not None and is_our_process(pid, program, args):
        return pid
    return None


def pids_holding_sockets(paths: Iterable[Path]) -> set[int]:
    """Pids of processes with one of the unix sockets bound at ``paths`` (how we find a node's slurmstepds)."""
    wanted = {str(p) for p in paths}
    if not wanted:
        return set()
    inodes: set[str] = set()
    with open("/proc/net/unix") as f:
        next(f, None)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[7] in wanted:
                inodes.add(parts[6])
    if not inodes:
        return set()
    targets = {f"socket:[{i}]" for i in inodes}
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    if os.readlink(fd.path) in targets:
                        found.add(int(entry.name))
                        break
                except OSError:
                    continue
    return found


def process_trees(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes ``pids`` and all their descendants (those still existing)."""
    procs: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            p = psutil.Process(pid)
            procs[pid] = p
            for child in p.children(recursive=True):
                procs[child.pid] = child
        except psutil.Error:
            continue
    return list(procs.values())


def freeze_and_kill(pids: Iterable[int], timeout: float = 10.0) -> list[int]:
    """SIGSTOP the trees of ``pids`` (so nothing forks away), then SIGKILL every member; returns the pids killed.

    Waits until they are gone; raises RuntimeError naming any survivor.
    """
    roots = list(pids)
    seen: dict[int, psutil.Process] = {}
    for _ in range(3):  # re-collect after stopping: a child forked mid-walk is caught on the next pass
        for p in process_trees(roots + list(seen)):
            if p.pid not in seen:
                seen[p.pid] = p
                with contextlib.suppress(psutil.Error):
                    p.send_signal(signal.SIGSTOP)
    for p in seen.values():
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
    alive = wait_gone(list(seen.values()), timeout)
    if alive:
        raise RuntimeError(f"processes survived SIGKILL: {sorted(p.pid for p in alive)}")
    return sorted(seen)


def _still_running(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    """Poll until every process has exited (zombies count as exited: init may reap them late); returns survivors."""
    deadline = time.monotonic() + timeout
    alive = [p for p in procs if _still_running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _still_running(p)]
    return alive


def terminate(pids: Iterable[int], timeout: float = 15.0) -> list[int]:
    """SIGTERM all ``pids`` at once (daemons take ~2 s each to stop), wait, SIGKILL stragglers; returns the pids
    that had to be killed."""
    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.send_signal(signal.SIGTERM)
            procs.append(p)
        except psutil.Error:
            continue
    killed = []
    for p in wait_gone(procs, timeout):
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGKILL)
            killed.append(p.pid)
    wait_gone(procs, 5.0)
    return killed


def wait_port(host: str, port: int, deadline: float) -> bool:
    """True once something accepts TCP connections on ``host:port``; False if ``deadline`` (monotonic) passes."""
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)


def port_in_use(port: int) -> bool:
    """True if a TCP listener already holds ``port`` (Slurm daemons bind 0.0.0.0, so test that address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return True
    return False

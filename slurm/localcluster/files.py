"""Small file helpers of the local cluster: atomic config writes, log tails, and the ROOT lock."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LOG_TAIL_LINES = 15


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} unreadable or missing)"
    return "\n".join(f"  | {line}" for line in text[-lines:]) or f"({path} is empty)"


def write_if_changed(path: Path, text: str, mode: int) -> bool:
    """Atomically replace ``path`` with ``text``; returns True if the content changed."""
    try:
        if path.read_text() == text:
            os.chmod(path, mode)
            return False
    except FileNotFoundError:
        pass
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, mode)
    os.replace(tmp, path)
    return True


@contextlib.contextmanager
def locked(root: Path, timeout: float, error: Callable[[str], Exception]) -> Iterator[None]:
    """Serialise up/down/crash/revive on one ROOT: test sessions of several developers may call ``up`` at once,
    and two of them starting the same daemon would fight over its port and pid file."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise error(f"another `python -m slurm.localcluster` holds {root / '.lock'} for more "
                                       f"than {timeout:.0f} s (fix: wait for it, or check what is stuck)") from None
                time.sleep(0.1)
        yield
    finally:
        os.close(fd)

"""Signals the batch step receives (USR1 before the time limit or on preemption, TERM on cancel/requeue).

Handlers only record the signal and wake the loop through a self-pipe: all decisions happen in the loop, never
inside a handler (a handler that does I/O or waits can deadlock or abort the batch step).
"""

from __future__ import annotations

import os
import selectors
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Received:
    signum: int
    name: str
    at: float  # unix time, comparable with Slurm's EndTime / PreemptTime


class SignalInbox:
    """Collects signals for the loop; ``wait(timeout)`` sleeps until a signal arrives or the timeout passes."""

    def __init__(self, signums: Iterable[int] = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)) -> None:
        self._pending: list[Received] = []
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._read_fd, selectors.EVENT_READ)
        self._previous = {s: signal.signal(s, self._handle) for s in signums}

    def _handle(self, signum: int, frame: object) -> None:
        self._pending.append(Received(signum, signal.Signals(signum).name, time.time()))
        try:
            os.write(self._write_fd, b"\0")
        except BlockingIOError:
            pass

    def wait(self, timeout: float) -> None:
        if not self._pending:
            self._selector.select(timeout)
        try:
            while os.read(self._read_fd, 512):
                pass
        except BlockingIOError:
            pass

    def drain(self) -> list[Received]:
        got, self._pending = self._pending, []
        return got

    def close(self) -> None:
        """Stop listening. USR1 is then ignored, whatever it was before: it only ever warns (time limit near,
        preemption), and one arriving while the supervisor shuts down must not kill it (its exit status is what
        the batch script and Slurm go by)."""
        for signum, handler in self._previous.items():
            signal.signal(signum, signal.SIG_IGN if signum == signal.SIGUSR1 else handler)
        self._selector.close()
        os.close(self._read_fd)
        os.close(self._write_fd)

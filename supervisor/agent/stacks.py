"""Stack dumps on request: signal the rank, wait for faulthandler's output to settle, save it.

WHY only ranks that advertise RANK_FLAG_STACK_DUMPS: the dump signal is a real-time signal whose
default action kills the process, so a rank without the client's handler must never receive it.
Dumps are saved in the campaign dir (``stacks/<node>-rank<N>-<time>.txt``, 0600) and only their path
travels to the supervisor, because a dump of many threads does not fit in one datagram.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from supervisor.client.slot import RANK_FLAG_STACK_DUMPS, STACK_DUMP_SIGNAL, SlotRecord, stacks_path
from supervisor.heartbeat import wire
from supervisor.heartbeat.secret import ensure_private_dir

MAX_DUMP_BYTES = 4 << 20
SETTLE_S = 0.2  # faulthandler writes thread after thread; wait until the file stops growing


@dataclass
class _Pending:
    rank: int
    path: Path
    start: int
    size: int
    changed: float
    deadline: float


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0


class StackDumps:
    def __init__(self, slot_dir: Path, out_dir: Path, node: str, timeout_s: float = 3.0) -> None:
        self.slot_dir, self.out_dir, self.node, self.timeout_s = slot_dir, out_dir, node, timeout_s
        self.pending: dict[int, _Pending] = {}

    def request(self, rank: int, rec: SlotRecord | None, now: float | None = None) -> wire.Event | None:
        """Signal one rank; returns a failure event at once if it cannot be asked."""
        now = time.monotonic() if now is None else now
        if rec is None:
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, "no slot for this rank on this node")
        if not rec.rank_flags & RANK_FLAG_STACK_DUMPS:
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, "rank has no stack-dump handler; not signalled")
        if rank in self.pending:
            return None
        path = stacks_path(self.slot_dir, rank)
        start = _size(path)
        try:
            os.kill(rec.pid, STACK_DUMP_SIGNAL)
        except OSError as err:
            return wire.Event(wire.EVENT_STACKS_FAILED, rank, f"cannot signal pid {rec.pid}: {err.strerror}")
        self.pending[rank] = _Pending(rank, path, start, start, now, now + self.timeout_s)
        return None

    def poll(self, now: float | None = None) -> list[wire.Event]:
        """Finish dumps whose output settled or timed out."""
        now = time.monotonic() if now is None else now
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

    def _save(self, p: _Pending) -> wire.Event:
        try:
            with open(p.path, "rb") as fh:
                fh.seek(p.start)
                data = fh.read(min(p.size - p.start, MAX_DUMP_BYTES))
            ensure_private_dir(self.out_dir)
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.3f}"[1:]
            out = self.out_dir / f"{self.node}-rank{p.rank}-{stamp}.txt"
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
        except OSError as err:
            return wire.Event(wire.EVENT_STACKS_FAILED, p.rank, f"cannot save dump: {err}")
        return wire.Event(wire.EVENT_STACKS_SAVED, p.rank, str(out))

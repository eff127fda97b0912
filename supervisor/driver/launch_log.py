"""A launch's log, read as it grows: each watch pass feeds the bytes written since the last one (at most
``PASS_BYTES``) to a :class:`~supervisor.decisions.log_digest.LogDigest`, and at the ending the rest. What the
classifier judges is the digest's lines (the earliest error lines of every task and of the whole log, srun's and
Slurm's own lines) merged with the log's last 64 KiB (the final exits, torchrun's summary), in log order.

Why not just the tail: at 1,000+ ranks the first failing rank's line is followed by every peer's watchdog trace
and scrolls out of any tail; the verdict became a communication error. Why as it grows: at the ending only the
bytes since the last pass are left to read, and memory stays bounded however long the launch ran.

A read error leaves what was read so far (the ending is judged on it); the file is the program's output, opened
read-only, never followed through a replaced path (the open descriptor is kept)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from supervisor.decisions import tasklog
from supervisor.decisions.log_digest import LogDigest
from supervisor.decisions.log_signatures import DEFAULT_LOG_SIGNATURES, LogSignature

PASS_BYTES = 16 << 20  # read per watch pass: a pass stays short even when a flood is being written
TAIL_BYTES = 65536  # the end of the log, read whole at the ending
TAIL_LINES = 400


class LaunchLog:
    """``tasks``: srun tasks of the launch; ``ranks_per_task``: ranks behind each (a node's under torchrun);
    ``markers``: False when the launch runs no torchrun (its report lines are then not looked for)."""

    def __init__(self, path: Path, *, tasks: int | None = None, ranks_per_task: int = 1,
                 signatures: Sequence[LogSignature] = DEFAULT_LOG_SIGNATURES, markers: bool = True,
                 start: int = 0) -> None:  # fmt: skip
        """``start``: the offset this reading begins at (a warm restart's generation: what its ranks print)."""
        self.path, self.start = path, start
        self.settings = {"tasks": tasks, "ranks_per_task": ranks_per_task, "signatures": signatures, "markers": markers}
        self.digest = LogDigest(signatures, tasks=tasks, ranks_per_task=ranks_per_task, markers=markers)
        self.digest.offset = self.digest.partial_start = start
        self.file: BinaryIO | None = None
        self.finished = False
        self.rank_logs: list[tuple[int, Path, int]] = []  # (rank, its own log, offset read from): ranks started again
        self.settled: set[int] = set()  # srun tasks whose end a warm restart already answered (settle_tasks)

    def from_now(self) -> LaunchLog:
        """A reading of the same log from the end of its last whole line: after a warm restart, the new
        generation's lines are judged alone (the failure before it was judged already)."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                f.seek(max(self.start, size - TAIL_BYTES))
                data = f.read(size - f.tell())
                start = size - len(data) + data.rfind(b"\n") + 1 if b"\n" in data else self.start
        except OSError:
            start = self.start
        again = LaunchLog(self.path, start=start, **self.settings)  # type: ignore[arg-type]
        again.settled = set(self.settled)
        for rank, path, _ in self.rank_logs:  # a rank started again earlier may still run: its lines from now
            again.add_rank_log(rank, path, _size(path))
        return again

    def settle_tasks(self, tasks: Sequence[int]) -> None:
        """srun tasks of the step whose ranks a warm restart started again elsewhere: srun's report of how they
        ended (``srun: error: node2: task 1: Exited with exit code 1``, written when it comes, often after the
        restart: a torchrun stops its node's other workers first) is the past fault's, not the new generation's."""
        self.settled.update(tasks)

    def add_rank_log(self, rank: int, path: Path, start: int = 0) -> None:
        """A rank started again by a warm restart writes its own log (its one-task step's, or a standby's): its
        last lines are judged with the launch's, labelled with its rank as srun labels the launch's own lines
        (so they count as that rank's output, never as srun's or Slurm's)."""
        self.rank_logs.append((rank, path, start))

    def _open(self) -> BinaryIO | None:
        if self.file is None:
            try:
                self.file = open(self.path, "rb")  # noqa: SIM115 (kept open across passes)
            except OSError:
                return None
        return self.file

    def advance(self, limit: int = PASS_BYTES) -> int:
        """Read and digest up to ``limit`` new bytes; how many were read (0: nothing new, or unreadable)."""
        if self.finished:
            return 0
        f = self._open()
        if f is None:
            return 0
        f.seek(self.digest.offset)
        data = f.read(limit)
        if data:
            self.digest.feed(data)
        return len(data)

    def finish(self) -> None:
        """The launch ended: read the rest, close the file."""
        if self.finished:
            return
        try:
            while self.advance(PASS_BYTES):
                pass
        except OSError:
            pass  # judged on what was read
        self.digest.finish()
        self.finished = True
        if self.file is not None:
            self.file.close()
            self.file = None

    def _tail(self) -> dict[int, str]:
        """offset -> line of the log's last ``TAIL_BYTES`` (a line cut at the start left out)."""
        try:
            with open(self.path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                start = max(self.start, size - TAIL_BYTES)
                f.seek(start)
                data = f.read(TAIL_BYTES)
        except OSError:
            return {}
        pos = 0
        if start > self.start:
            pos = data.find(b"\n") + 1
            if pos == 0:
                return {}
        out: dict[int, str] = {}
        for raw in data[pos:].split(b"\n"):  # \n only: srun labels every line of a rank's output (a long one in labelled 1 KiB pieces,
            # measured on 22.05); a \r inside a line is the rank's own text, and splitting there would make the rest
            # an unlabelled line, as if srun or Slurm had written it (docs/security.md)
            if raw:
                out[start + pos] = raw.decode(errors="replace")
            pos += len(raw) + 1
        return dict(list(out.items())[-TAIL_LINES:])

    def lines(self) -> list[str]:
        """What to judge: the digest's lines and the tail's, in log order (finishes the read first); then the last
        lines of each rank started again, labelled with its rank."""
        self.finish()
        merged = dict(self.digest.lines())
        merged.update(self._tail())
        own = [f"{rank}: {text}" for rank, path, start in self.rank_logs for text in _last_lines(path, start)]
        return [text for _, text in sorted(merged.items()) if not self._settled_line(text)] + own

    def _settled_line(self, text: str) -> bool:
        """Whether ``text`` is srun's report of how tasks ended that names only settled tasks."""
        if not self.settled:
            return False
        ended = tasklog.srun_task_exits([text])
        return bool(ended) and all(e.task in self.settled for e in ended)

    def torchrun_restarts(self, step_nodes: Sequence[str], tasks_per_node: int = 1) -> dict[str, int]:
        """node -> restarts of its workers by torchrun itself during the launch (``--max-restarts`` > 0), from
        torchrun's report lines wherever they are in the log; {} when there were none."""
        self.finish()
        by_task = tasklog.torchrun_restarts(self.digest.markers())
        nodes = tasklog.task_nodes(step_nodes, tasks_per_node) if step_nodes else ()
        out: dict[str, int] = {}
        for task, n in by_task.items():
            node = nodes[task] if task < len(nodes) else f"task {task}"
            out[node] = out.get(node, 0) + n
        return out


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _last_lines(path: Path, start: int, limit: int = TAIL_LINES) -> list[str]:
    """The last lines of a rank's own log after ``start`` (its last ``TAIL_BYTES``; a line cut at the front left
    out; split at \n only, as the launch log); [] when unreadable."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            begin = max(start, size - TAIL_BYTES)
            f.seek(begin)
            data = f.read(TAIL_BYTES)
    except OSError:
        return []
    if begin > start:
        data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
    return [raw.decode(errors="replace") for raw in data.split(b"\n") if raw][-limit:]

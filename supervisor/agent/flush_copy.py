"""The node agent's part of the memory tier's flush: before the job stops (preemption, time limit, ``supervise
cancel --checkpoint``) the supervisor orders each node holding a shard of the snapshot it chose to copy that shard
from node memory into a staging directory on the shared filesystem; the supervisor commits the directory once
every rank's shard is there (``driver.memory_flush``), so the requeued job, on other nodes, resumes from it.

Each copy is hashed while it is written and kept only when its SHA-256 is the one in the shard's record (the
bytes in memory were verified when written; a copy torn on the way is not kept); the shard is renamed into place
first and its record last, as in the store itself (a shard without its record does not exist). The copies run on
a thread of their own: the agent's loop, and its heartbeats, never wait for a filesystem.

The same copy persists a snapshot periodically while the training runs (``driver.memory_persist``, an order
marked ``background``). The ranks go on snapshotting and delete all but their newest two steps, so a step the
supervisor saw in a report may be gone by the time the order arrives: a background order's step is a lower
bound instead, and the agent takes, for each of its ranks, the first snapshot of that launch at or after it,
opens them all (an open file outlives the ranks' deletion) and only then copies. The ranks snapshot the same
steps, so every node takes the same one; the supervisor commits only when they did. Such a copy is not the
stop's flush the agent lingers for at SIGTERM (``finished`` counts only the others); a stop's order goes before
background orders still queued, a newer background order replaces a queued one, and any order ends a background
copy's wait for its snapshot.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.agent import replica_store
from supervisor.heartbeat.orders import Flush, FlushShard

CHUNK = 4 << 20
PERSIST_WAIT_S = 30.0  # a background order's wait for its ranks' next snapshot (the supervisor drops it after)
PERSIST_POLL_S = 0.02  # the ranks keep two steps: seen within two snapshot intervals, or taken after another


def find(root: Path, shard: FlushShard) -> Path | None:
    """This node's copy of the shard the order names (its own ranks' or a buddy's), written by that launch."""
    folders = [root / f"step_{shard.step}"]
    try:
        folders += [p / f"step_{shard.step}" for p in sorted((root / replica_store.REPLICA_DIR).iterdir())]
    except OSError:
        pass
    for folder in folders:
        path = folder / f"rank_{shard.rank}.snap"
        record = replica_store.read_record(path)
        if record is not None and record.get("launch") == shard.launch and path.is_file():
            return path
    return None


def copy_shard(root: Path, directory: Path, shard: FlushShard) -> str:
    """Copy one shard and its record into ``directory``; "copied", or why not ("missing", "digest", an OS error)."""
    source = find(root, shard)
    if source is None:
        return "missing"
    record = replica_store.read_record(source)
    if record is None or not isinstance(record.get("sha256"), str):
        return "missing"
    try:
        src = open(source, "rb")
    except OSError:
        return "missing"
    with src:
        return _copy_open(src, record, directory, shard.rank)


def first_at_or_after(root: Path, shard: FlushShard) -> tuple[Path, dict[str, object]] | None:
    """This node's own shard of ``shard.rank`` written by ``shard.launch`` at the lowest step >= ``shard.step``."""
    try:
        steps = sorted(int(p.name[5:]) for p in root.iterdir() if p.name.startswith("step_") and p.name[5:].isdigit())
    except OSError:
        return None
    for step in steps:
        if step < shard.step:
            continue
        path = root / f"step_{step}" / f"rank_{shard.rank}.snap"
        record = replica_store.read_record(path)
        if record is not None and record.get("launch") == shard.launch and record.get("step") == step \
                and isinstance(record.get("sha256"), str):  # fmt: skip
            return path, record
    return None


def pin_next(root: Path, shards: tuple[FlushShard, ...], deadline: float,
             interrupted: Callable[[], bool] = lambda: False) -> list[tuple[Any, dict[str, object], int]]:  # fmt: skip
    """Open each rank's first snapshot of one same step at or after the order's step, all at once (waiting for the
    ranks to write it until the monotonic ``deadline``, or until ``interrupted()``: a stop's flush is waiting);
    [] when they did not."""
    while time.monotonic() < deadline and not interrupted():
        found = [first_at_or_after(root, shard) for shard in shards]
        steps = {f[1].get("step") for f in found if f is not None}
        if len(steps) > 1:  # a rank's snapshot went before it was seen: all from the newest seen on
            floor = max(int(step) for step in steps if isinstance(step, int))
            shards = tuple(FlushShard(max(floor, shard.step), shard.rank, shard.launch) for shard in shards)
            continue
        if all(f is not None for f in found):
            opened: list[tuple[Any, dict[str, object], int]] = []
            try:
                for shard, hit in zip(shards, found, strict=True):
                    assert hit is not None
                    opened.append((open(hit[0], "rb"), hit[1], shard.rank))
                return opened
            except OSError:  # deleted between the look and the open: look again
                for f, _, _ in opened:
                    f.close()
        time.sleep(PERSIST_POLL_S)
    return []


def _copy_open(src: Any, record: dict[str, object], directory: Path, rank: int) -> str:
    tmp = directory / f".rank_{rank}.snap.tmp"
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                digest.update(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        if digest.hexdigest() != record["sha256"]:
            tmp.unlink(missing_ok=True)
            return "digest"
        os.replace(tmp, directory / f"rank_{rank}.snap")
        side = directory / f".rank_{rank}.json.tmp"
        with open(side, "w") as f:
            f.write(json.dumps(record))
            f.flush()
            os.fsync(f.fileno())
        os.replace(side, directory / f"rank_{rank}.json")
    except OSError as err:
        tmp.unlink(missing_ok=True)
        return f"error: {err.strerror or err}"
    return "copied"


class Flusher:
    """Runs the supervisor's flush orders, one at a time, off the agent's loop."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.counters: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.queue: list[Flush] = []
        self.finished = 0  # a stopping job's flush orders carried out (whatever their outcome); not background ones

    def _stop_waiting(self) -> bool:
        """A background copy waiting for its snapshot gives way to any later order: a stop's flush, or a newer
        persist (the supervisor gave the waiting one up: its launch ended, a node of it is gone)."""
        with self.lock:
            return bool(self.queue)

    def busy(self) -> bool:
        """A flush is queued or under way."""
        with self.lock:
            return bool(self.queue) or (self.thread is not None and self.thread.is_alive())

    def order(self, flush: Flush) -> None:
        with self.lock:
            if flush.background:  # a newer persist replaces one still queued
                self.queue = [queued for queued in self.queue if not queued.background]
                self.queue.append(flush)
            else:  # the job is stopping: its copy first, the periodic ones after it
                at = next((i for i, queued in enumerate(self.queue) if queued.background), len(self.queue))
                self.queue.insert(at, flush)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._run, name="agent-memory-flush", daemon=True)
                self.thread.start()

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self.queue:
                    return
                flush = self.queue.pop(0)
            try:
                self.run(flush)
            finally:
                with self.lock:
                    self.finished += not flush.background

    def run(self, flush: Flush) -> None:
        directory = Path(flush.directory)
        try:
            directory.mkdir(mode=0o700, exist_ok=True)  # its parent is the campaign's: never created here
        except OSError as err:
            self.counters["flush_no_dir"] += 1
            print(f"supervisor agent: flush to {directory} impossible: {err}", file=sys.stderr, flush=True)
            return
        outcomes: Counter[str] = Counter()
        if flush.background:
            opened = pin_next(self.root, flush.shards, time.monotonic() + PERSIST_WAIT_S, self._stop_waiting)
            if not opened:
                outcomes["missing"] += len(flush.shards)
            for src, record, rank in opened:
                with src:
                    outcomes[_copy_open(src, record, directory, rank)] += 1
        else:
            for shard in flush.shards:
                outcomes[copy_shard(self.root, directory, shard)] += 1
        for outcome, n in outcomes.items():
            self.counters[f"flush_{outcome.split(':')[0]}"] += n
        print(f"supervisor agent: flush to {directory}: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())),
              file=sys.stderr, flush=True)  # fmt: skip

    def join(self, timeout: float) -> None:
        thread = self.thread
        if thread is not None:
            thread.join(timeout)

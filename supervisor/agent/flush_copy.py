"""The node agent's part of the memory tier's flush: before the job stops (preemption, time limit, ``supervise
cancel --checkpoint``) the supervisor orders each node holding a shard of the snapshot it chose to copy that shard
from node memory into a staging directory on the shared filesystem; the supervisor commits the directory once
every rank's shard is there (``driver.memory_flush``), so the requeued job, on other nodes, resumes from it.

Each copy is hashed while it is written and kept only when its SHA-256 is the one in the shard's record (the
bytes in memory were verified when written; a copy torn on the way is not kept); the shard is renamed into place
first and its record last, as in the store itself (a shard without its record does not exist). The copies run on
a thread of their own: the agent's loop, and its heartbeats, never wait for a filesystem.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from collections import Counter
from pathlib import Path

from supervisor.agent import replica_store
from supervisor.heartbeat.orders import Flush, FlushShard

CHUNK = 4 << 20


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
    tmp = directory / f".rank_{shard.rank}.snap.tmp"
    digest = hashlib.sha256()
    try:
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)
                digest.update(chunk)
            dst.flush()
            os.fsync(dst.fileno())
        if digest.hexdigest() != record["sha256"]:
            tmp.unlink(missing_ok=True)
            return "digest"
        os.replace(tmp, directory / f"rank_{shard.rank}.snap")
        side = directory / f".rank_{shard.rank}.json.tmp"
        with open(side, "w") as f:
            f.write(json.dumps(record))
            f.flush()
            os.fsync(f.fileno())
        os.replace(side, directory / f"rank_{shard.rank}.json")
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
        self.finished = 0  # flush orders carried out (whatever their outcome)

    def busy(self) -> bool:
        """A flush is queued or under way."""
        with self.lock:
            return bool(self.queue) or (self.thread is not None and self.thread.is_alive())

    def order(self, flush: Flush) -> None:
        with self.lock:
            self.queue.append(flush)
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
                    self.finished += 1

    def run(self, flush: Flush) -> None:
        directory = Path(flush.directory)
        try:
            directory.mkdir(mode=0o700, exist_ok=True)  # its parent is the campaign's: never created here
        except OSError as err:
            self.counters["flush_no_dir"] += 1
            print(f"supervisor agent: flush to {directory} impossible: {err}", file=sys.stderr, flush=True)
            return
        outcomes: Counter[str] = Counter()
        for shard in flush.shards:
            outcome = copy_shard(self.root, directory, shard)
            self.counters[f"flush_{outcome.split(':')[0]}"] += 1
            outcomes[outcome] += 1
        print(f"supervisor agent: flush to {directory}: " + ", ".join(f"{n} {o}" for o, n in sorted(outcomes.items())),
              file=sys.stderr, flush=True)  # fmt: skip

    def join(self, timeout: float) -> None:
        thread = self.thread
        if thread is not None:
            thread.join(timeout)

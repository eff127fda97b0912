"""Where a node agent keeps the shards other agents send it, and the shards it sends: the files of the memory
store (``checkpoint/memory.py`` writes the ranks' own ones).

Layout under the store: the node's own ranks' shards in ``step_N/rank_R.snap`` + ``rank_R.json`` (the record); a
buddy's in ``replica/<origin node>/step_N/...`` with the same names. A received shard is streamed into a hidden
temporary file while it is hashed, kept only when its SHA-256 is the one its authenticated header named, and its
record is renamed into place last (a shard without its record does not exist, as for the ranks' own). A buddy's
copies are kept for the newest ``keep`` steps of each origin.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from supervisor.agent.replication_wire import ShardHeader

REPLICA_DIR = "replica"
_STEP = re.compile(r"step_(\d+)")
SPACE_MARGIN = 64 << 20  # leave this much of the store's filesystem free (the ranks' next snapshots need room)


def folder_for(root: Path, header: ShardHeader) -> Path:
    if header.dest == "own":
        return root / f"step_{header.step}"
    return root / REPLICA_DIR / header.origin / f"step_{header.step}"


def has_room(root: Path, size: int) -> bool:
    try:
        st = os.statvfs(root)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize >= size + SPACE_MARGIN


def receive(root: Path, header: ShardHeader, chunks: Iterator[bytes]) -> bool:
    """Write the payload ``chunks`` as the shard ``header`` describes; True when kept (its digest matched)."""
    folder = folder_for(root, header)
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = folder / f".rank_{header.rank}.recv.tmp"
    digest = hashlib.sha256()
    size = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                digest.update(chunk)
                size += len(chunk)
        if size != header.size or digest.hexdigest() != header.sha256:
            tmp.unlink(missing_ok=True)
            return False
        os.replace(tmp, folder / f"rank_{header.rank}.snap")
        record = {"step": header.step, "rank": header.rank, "world": header.world, "size": header.size,
                  "sha256": header.sha256, "launch": header.launch}  # fmt: skip
        side = folder / f".rank_{header.rank}.json.tmp"
        side.write_text(json.dumps(record))
        os.replace(side, folder / f"rank_{header.rank}.json")
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    if header.dest == "replica":
        retain(root / REPLICA_DIR / header.origin, keep=2)
    return True


def retain(origin_dir: Path, keep: int) -> None:
    """Keep the newest ``keep`` steps of one origin's copies."""
    try:
        steps = sorted((int(m.group(1)), p) for p in origin_dir.iterdir() if (m := _STEP.fullmatch(p.name)))
    except OSError:
        return
    for _, folder in steps[: max(0, len(steps) - keep)]:
        shutil.rmtree(folder, ignore_errors=True)


def own_shards(root: Path) -> list[tuple[int, int, Path]]:
    """The node's own ranks' shards that have their record: (step, rank, shard path), newest step first."""
    out = []
    try:
        folders = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.fullmatch(p.name))]
    except OSError:
        return []
    for step, folder in sorted(folders, reverse=True):
        try:
            names = {p.name for p in folder.iterdir()}
        except OSError:
            continue
        for name in names:
            m = re.fullmatch(r"rank_(\d+)\.json", name)
            if m and f"rank_{m.group(1)}.snap" in names:
                out.append((step, int(m.group(1)), folder / f"rank_{m.group(1)}.snap"))
    return out


def find_shard(root: Path, step: int, rank: int) -> Path | None:
    """This node's copy of ``rank``'s shard of ``step`` (its own or a buddy's), with its record; None if none."""
    candidates = [root / f"step_{step}"]
    try:
        candidates += [p / f"step_{step}" for p in sorted((root / REPLICA_DIR).iterdir())]
    except OSError:
        pass
    for folder in candidates:
        shard = folder / f"rank_{rank}.snap"
        if shard.is_file() and (folder / f"rank_{rank}.json").is_file():
            return shard
    return None


def read_record(shard: Path) -> dict[str, object] | None:
    try:
        doc = json.loads(shard.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def chunked(path: Path, chunk: int = 1 << 20, pace: Callable[[int], None] | None = None) -> Iterator[bytes]:
    """The file's bytes in chunks; ``pace(n)`` is called before each (the bandwidth cap)."""
    with open(path, "rb") as f:
        while True:
            if pace is not None:
                pace(chunk)
            data = f.read(chunk)
            if not data:
                return
            yield data

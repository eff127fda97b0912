"""What a node's memory store holds, verified: the node agent's side of the memory tier's restore pick
(``decisions.memory_pick``): its own ranks' shards and the copies it keeps for its buddy (``replica/<node>/``).
No torch, nothing unpickled: a shard counts only when its record
(``rank_R.json``) parses, its header parses (``checkpoint.snapshot_format``), and its bytes hash to the recorded
SHA-256. Each file is hashed once (its size and mtime remembered), so a scan every few seconds costs a directory
listing once the store is verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.checkpoint.snapshot_format import MAX_HEADER, SnapshotFormatError, check_size, parse_header
from supervisor.decisions.memory_pick import Held

_STEP = re.compile(r"step_(\d+)")
_RECORD = re.compile(r"rank_(\d+)\.json")
CHUNK = 1 << 20


@dataclass
class Inventory:
    """Verified shards under ``root`` (the node's ``$SUPERVISOR_MEMORY_DIR``)."""

    root: Path
    seen: dict[tuple[str, int, int], Held | None] = field(default_factory=dict)  # (path, size, mtime) -> verdict

    def scan(self) -> list[Held]:
        """Every shard of the store, verified or not (``Held.verified``), newest steps first."""
        held: list[Held] = []
        steps: list[tuple[int, Path]] = []
        for base in [self.root, *_replica_dirs(self.root)]:  # the node's own ranks', then its buddies' copies
            try:
                steps += [(int(m.group(1)), p) for p in base.iterdir() if (m := _STEP.fullmatch(p.name))]
            except OSError:
                if base == self.root:
                    return []
        live: set[tuple[str, int, int]] = set()
        for step, folder in sorted(steps, reverse=True):
            try:
                records = [p for p in folder.iterdir() if _RECORD.fullmatch(p.name)]
            except OSError:
                continue
            for record in records:
                shard = record.with_suffix(".snap")
                try:
                    st = os.stat(shard)
                except OSError:
                    continue
                key = (str(shard), st.st_size, st.st_mtime_ns)
                live.add(key)
                if key not in self.seen:
                    self.seen[key] = verify(record, shard, step)
                if self.seen[key] is not None:
                    held.append(self.seen[key])  # type: ignore[arg-type]
        self.seen = {k: v for k, v in self.seen.items() if k in live}
        return held


def _replica_dirs(root: Path) -> list[Path]:
    try:
        return sorted(p for p in (root / "replica").iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return []


def verify(record: Path, shard: Path, step: int) -> Held | None:
    """The shard as a ``Held`` (``verified`` when its bytes match its record), or None when its record or header
    is unreadable (not a shard of ours)."""
    try:
        doc = json.loads(record.read_text())
        with open(shard, "rb") as f:
            first = f.read(16)
            length = int.from_bytes(first[8:16], "little") if len(first) == 16 else 0
            head = first + f.read(min(length, MAX_HEADER))
            header, start = parse_header(head)
            size = os.fstat(f.fileno()).st_size
            check_size(header, start, size)
            digest = hashlib.sha256(head)
            while chunk := f.read(CHUNK):
                digest.update(chunk)
    except (OSError, ValueError, SnapshotFormatError):
        return None
    if not isinstance(doc, dict) or (doc.get("step"), doc.get("rank"), doc.get("world")) != \
            (header.step, header.rank, header.world) or header.step != step:  # fmt: skip
        return None
    recorded = doc.get("sha256")
    if not isinstance(recorded, str):
        return None
    launch = doc.get("launch", "")
    if not isinstance(launch, str):
        return None
    return Held(step, header.rank, header.world, recorded, digest.hexdigest() == recorded and doc.get("size") == size,
                launch[:64])

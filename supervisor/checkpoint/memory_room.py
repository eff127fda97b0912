"""Whether node memory has room for the memory tier, and how a rank tells its node agent that it had none.

A full /dev/shm is worse than no snapshots: data loaders, NCCL and the program's own shared memory live there
too. So before its first snapshot a rank checks that its node's store has room for everything the tier keeps
there (``room_needed``: each of the node's ranks' ``keep`` newest shards, the one being written and the
roll-back ring's, and the buddy node's newest copies, sizes assumed alike), and a rank whose write fails anyway (ENOSPC, EIO...)
turns its snapshots off. Either way it leaves an empty marker file in the store, ``.off-rank_R-errno_E`` (a name,
no bytes: it still fits when the store is full), which the agent reports (``memory_report``'s ``off``) and the
supervisor turns into one journaled ``memory_off`` and the campaign's snapshots off
(``decisions.memory_off``, ``driver.memory_off``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_MARKER = re.compile(r"\.off-rank_(\d{1,8})-errno_(\d{1,4})")


def room_needed(shard_bytes: int, keep: int, ranks_on_node: int, ring: int = 0) -> int:
    """Bytes of node memory the tier fills on one node at most (plus 10 %: headers, alignment, the filesystem):
    per rank its ``keep`` newest shards, the one being written and the roll-back ring's two per distance
    (``ring`` distances, ``decisions.snapshot_ring``), and the buddy's ``keep`` newest."""
    per_rank = shard_bytes * (keep + 1 + 2 * ring) + shard_bytes * keep
    return int(per_rank * max(1, ranks_on_node) * 1.1)


def free_bytes(root: Path) -> int | None:
    """Free bytes where ``root`` is (None: unknown, e.g. not there yet)."""
    try:
        st = os.statvfs(root)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def short_of_room(root: Path, shard_bytes: int, keep: int, ranks_on_node: int, ring: int = 0) -> str:
    """Why the store at ``root`` is too small for the tier ("" when it has room or its free space is unknown)."""
    need, free = room_needed(shard_bytes, keep, ranks_on_node, ring), free_bytes(root)
    if free is None or free >= need:
        return ""
    return (f"{root} has {free / 2**20:.0f} MiB free and this node's snapshots need about {need / 2**20:.0f} MiB "
            "(its ranks' newest copies and its buddy's)")


def mark_off(root: Path, rank: int, errno: int) -> None:
    """Leave the marker for the agent; a store that cannot take even a name is left as it is."""
    try:
        fd = os.open(root / f".off-rank_{rank}-errno_{errno}", os.O_CREAT | os.O_WRONLY | os.O_NOFOLLOW, 0o600)
        os.close(fd)
    except OSError:
        pass


def read_off(root: Path, limit: int = 64) -> tuple[tuple[int, int], ...]:
    """(rank, errno) of the markers in ``root``, at most ``limit``; an unreadable store: none."""
    try:
        names = os.listdir(root)
    except OSError:
        return ()
    found = sorted((int(m.group(1)), int(m.group(2))) for name in names if (m := _MARKER.fullmatch(name)))
    return tuple(found[:limit])

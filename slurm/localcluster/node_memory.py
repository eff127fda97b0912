"""A crashed node's memory: on a real cluster a dead machine's RAM (its /dev/shm) is gone with it; the local
cluster's nodes share one host's /dev/shm, so ``crash-node`` removes what the dead node held there itself."""

from __future__ import annotations

import shutil
from pathlib import Path

NODE_MEMORY_ROOT = Path("/dev/shm")
NODE_MEMORY_PREFIX = "supervisor-"  # the node agents' slot directories (supervisor/paths.py), memory store inside


def wipe_node_memory(node: str, root: Path = NODE_MEMORY_ROOT) -> list[str]:
    """What a dead machine loses with its RAM: every node agent's slot directory of ``node`` (named
    ``supervisor-...-<node>``), and with it the memory tier's snapshots held there. All local nodes share one
    host's /dev/shm, so without this a "crashed" node's snapshots would outlive it. Returns the paths removed."""
    gone: list[str] = []
    try:
        entries = list(root.iterdir())
    except OSError:
        return gone
    for entry in entries:
        if entry.name.startswith(NODE_MEMORY_PREFIX) and entry.name.endswith(f"-{node}") and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            gone.append(str(entry))
    return sorted(gone)

"""Create the node-local slot directory so that no other local user can squat it, swap it or widen it.

WHY: ``/dev/shm`` is shared by every user of a node. A directory that another user created first (or a
symlink planted at its name) would let them deny supervision or read/forge the ranks' heartbeats. The name
carries a random per-run token (``paths.slot_dir_template``), so it cannot be created in advance; an existing
entry is accepted only if ``lstat`` shows a real directory owned by us (an agent restarted within the run),
and the mode is set through a descriptor opened with ``O_NOFOLLOW`` on that very directory.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class SlotDirError(OSError):
    """The slot directory is not ours (someone else's, a symlink, not a directory)."""


def make_slot_dir(path: Path) -> Path:
    """Create ``path`` (0700) or adopt our own existing directory there; raise ``SlotDirError`` otherwise."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    before = os.lstat(path)
    if not stat.S_ISDIR(before.st_mode):
        raise SlotDirError(f"{path} exists and is not a directory (a symlink or file planted there?)")
    if before.st_uid != os.geteuid():
        raise SlotDirError(f"{path} is owned by uid {before.st_uid}, not by us (uid {os.geteuid()})")
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        now = os.fstat(fd)
        if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) or now.st_uid != os.geteuid():
            raise SlotDirError(f"{path} was replaced while it was being checked")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
    return path

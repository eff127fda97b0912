"""Durable filesystem steps: a rename is only a commit once the data and the directory entry are fsynced.

Written where others may write too (a shared checkpoint root, docs/security.md): a temp file gets a random name
and is created exclusively without following links (``O_EXCL | O_NOFOLLOW``), so nothing planted under a
predictable name can turn the write into one of the user's files; the rename then replaces whatever is at the
final name (a planted link included) and never writes through it.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory fsync makes its entries - creates, renames - durable)."""
    flags = os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0)
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Write ``path`` atomically: temp file, fsync, rename, fsync the parent - readers see old or new, never torn."""
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_path(path.parent)


def rename_durable(src: Path, dst: Path) -> None:
    """Atomically rename ``src`` to ``dst`` (same filesystem) and make the new name durable."""
    os.rename(src, dst)
    fsync_path(dst.parent)
    if src.parent != dst.parent:
        fsync_path(src.parent)

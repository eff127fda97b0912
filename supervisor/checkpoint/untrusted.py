"""Reading files in a checkpoint root that others may write, and judging whether they could have.

A checkpoint root is a directory the user names; on a shared filesystem, group members or everyone may write
into it or into a directory above it (docs/security.md). Two rules, both without trusting a name:

* **Reads are bounded and never block.** A planted FIFO named ``.metadata`` blocked the resume pick forever; a
  link to ``/dev/zero`` exhausted memory. Every file is opened with ``O_NONBLOCK`` (a FIFO's open returns at
  once), judged on the opened descriptor (``fstat``: a regular file, within the size allowed), and read from
  that descriptor only, so a rename between the check and the read changes nothing.
* **Foreign checkpoints are adopted only from a tree nobody else can change.** A checkpoint without this
  campaign's signature is loaded by the ranks with ``pickle``; whoever could write any of its files, any
  directory between the root and it, or replace a directory above the root, could run code as the user. So
  every file and directory of it must be the user's and not writable by group or others, the directories from
  the root down to it too, and every directory above the root must be the user's or root's and not writable by
  others unless sticky (``/tmp``): :func:`tree_problem`.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

MAX_SMALL_BYTES = 1 << 20  # reason files, LATEST: a line or two


class UntrustedFileError(OSError):
    """The file cannot be read safely: not a regular file, a symlink where none is allowed, or too large."""


def open_regular(path: str | os.PathLike[str], max_bytes: int | None, *, follow: bool = False) -> int:
    """A descriptor of ``path`` for reading, once it is known to be a regular file of at most ``max_bytes``
    (None: any size). ``follow``: a symlink is allowed (a confined link inside a checkpoint directory)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP:  # O_NOFOLLOW met a symlink
            raise UntrustedFileError(err.errno, "is a symbolic link", str(path)) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UntrustedFileError(errno.EISDIR, "is not a regular file", str(path))
        if max_bytes is not None and st.st_size > max_bytes:
            raise UntrustedFileError(errno.EFBIG, f"is larger than {max_bytes} bytes", str(path))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], max_bytes: int, *, follow: bool = False) -> bytes:
    """The whole of a regular file of at most ``max_bytes`` (read from the descriptor that was checked; a file
    that grew since is cut at ``max_bytes + 1`` and refused)."""
    fd = open_regular(path, max_bytes, follow=follow)
    try:
        chunks, total = [], 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise UntrustedFileError(errno.EFBIG, f"is larger than {max_bytes} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _mode_text(st: os.stat_result) -> str:
    return f"{stat.S_IMODE(st.st_mode):o}"


def _own_problem(path: str, st: os.stat_result, uid: int) -> str:
    """Why others could change ``path`` itself (not the user's, or writable by group or others)."""
    if st.st_uid != uid:
        return f"{path} is owned by uid {st.st_uid}, not by this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {_mode_text(st)})"
    return ""


def ancestors_problem(root: str | os.PathLike[str], uid: int | None = None) -> str:
    """Why someone else could replace ``root`` through a directory above it: one that is neither the user's nor
    root's, or writable by group or others without the sticky bit ("" when none)."""
    uid = os.geteuid() if uid is None else uid
    path = Path(os.path.abspath(root)).parent
    for directory in (path, *path.parents):
        try:
            st = os.stat(directory)
        except OSError as err:
            return f"{directory} cannot be examined ({err.strerror})"
        if st.st_uid not in (uid, 0):
            return f"{directory}, a directory above it, is owned by uid {st.st_uid}"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return f"{directory}, a directory above it, is writable by other users (mode {_mode_text(st)})"
    return ""


def tree_problem(root: str | os.PathLike[str], target: str | os.PathLike[str], uid: int | None = None,
                 max_entries: int = 1 << 20) -> str:  # fmt: skip
    """Why others could have written the checkpoint ``target`` under ``root`` ("" when nobody else could): the
    directories above the root, the root and every directory down to the target, and the target with everything
    in it (files and directories; a link inside it must lead inside it, where its target is checked)."""
    uid = os.geteuid() if uid is None else uid
    root_path, target_path = Path(os.path.abspath(root)), Path(os.path.abspath(target))
    problem = ancestors_problem(root_path, uid)
    if problem:
        return problem
    try:
        relative = target_path.relative_to(root_path)
    except ValueError:
        return f"{target_path} is not under the checkpoint directory {root_path}"
    chain = [root_path, *(root_path / Path(*relative.parts[: i + 1]) for i in range(len(relative.parts)))]
    seen = 0
    for path in chain:
        try:
            st = os.lstat(path)
        except OSError as err:
            return f"{path} cannot be examined ({err.strerror})"
        if stat.S_ISLNK(st.st_mode) and path != root_path:
            return f"{path} is a symbolic link"
        problem = _own_problem(str(path), os.stat(path) if path == root_path else st, uid)
        if problem:
            return problem
    if target_path.is_dir() and not target_path.is_symlink():
        for directory, dirs, files in os.walk(target_path, followlinks=False):
            for name in (*dirs, *files):
                seen += 1
                if seen > max_entries:
                    return f"{target_path} holds more than {max_entries} entries"
                entry = os.path.join(directory, name)
                st = os.lstat(entry)
                if stat.S_ISLNK(st.st_mode):  # a link is as safe as where it leads: inside, walked there
                    if not os.path.realpath(entry).startswith(os.path.realpath(target_path) + os.sep):
                        return f"{entry} is a symbolic link to outside the checkpoint"
                    continue
                problem = _own_problem(entry, st, uid)
                if problem:
                    return problem
    return ""

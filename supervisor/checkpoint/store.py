"""A directory of checkpoints: list them with a status, pick the newest valid, quarantine bad ones.

The supervisor uses this before every (re)start to fill ``SUPERVISOR_RESUME_FROM``; it never imports
torch and never deletes an invalid checkpoint - it moves it into ``ROOT/quarantine/`` with a reason.
"""

from __future__ import annotations

import builtins
import dataclasses
import errno
import os
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from supervisor.checkpoint import single_file, trust, untrusted
from supervisor.checkpoint.durable import fsync_path, write_durable
from supervisor.checkpoint.manifest import MANIFEST_NAME
from supervisor.checkpoint.retention import steps_to_delete
from supervisor.checkpoint.validate import (
    DCP_METADATA,
    INCOMPLETE,
    INCOMPLETE_PREFIX,
    INVALID,
    REFUSED,
    UNVERIFIED,
    VALID,
    Validation,
    step_from_name,
    validate_checkpoint,
)

QUARANTINE_DIR = "quarantine"
REASON_FILE = "QUARANTINE_REASON.txt"
LATEST_FILE = "LATEST"
CHECKPOINT_PREFIX = "step_"


def checkpoint_name(step: int) -> str:
    """Directory name of the checkpoint of ``step``; zero-padded so names sort by step."""
    return f"{CHECKPOINT_PREFIX}{step:09d}"


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    step: int | None
    time: float | None  # commit time (manifest), else the directory's mtime
    size_bytes: int
    status: str  # "valid" | "invalid" | "incomplete" | "unverified"
    reason: str
    verified_hashes: bool = False

    @classmethod
    def from_validation(cls, v: Validation) -> CheckpointInfo:
        return cls(v.path, v.step, v.time, v.size_bytes, v.status, v.reason, v.full)

    def to_json(self) -> dict[str, object]:
        return {"path": str(self.path), "name": self.path.name, "step": self.step, "time": self.time,
                "size_bytes": self.size_bytes, "status": self.status, "reason": self.reason,
                "verified_hashes": self.verified_hashes}


@dataclass(frozen=True)
class QuarantinedInfo:
    path: Path
    reason: str


# Where Lightning keeps single-file checkpoints under its default_root_dir / a ModelCheckpoint dirpath.
_FILE_SUBDIRS = ("checkpoints", "lightning_logs/*/checkpoints")


class CheckpointStore:
    """Checkpoints under ``root``: committed ``step_*`` dirs, adopted DCP dirs, single ``.ckpt``/``.pt``
    files and ``.incomplete-*`` temps.

    ``key``: the campaign's manifest key (trust.campaign_key); manifests signed with it are trusted anywhere.
    Everything else is *foreign* and usable only while ``adopt_foreign`` and the root is private (owned by
    this user, not writable by group or others): see trust.py and docs/security.md.
    """

    def __init__(self, root: str | os.PathLike[str], key: bytes | None = None, adopt_foreign: bool = True) -> None:
        self.root = Path(root)
        self.key = key
        self.adopt_foreign = adopt_foreign
        self._root_problem: str | None = None
        self.refused: builtins.list[CheckpointInfo] = []  # foreign ones newest_valid skipped, newest first

    # -- discovery -------------------------------------------------------------------------------------
    def _candidates(self) -> list[Path]:
        found: list[Path] = []
        with os.scandir(self.root) as it:
            for entry in it:
                if entry.name == QUARANTINE_DIR or entry.is_symlink():
                    continue
                path = Path(entry.path)
                if entry.is_file(follow_symlinks=False):
                    if single_file.is_candidate(entry.name):
                        found.append(path)
                    continue
                if not entry.is_dir():
                    continue
                if (entry.name.startswith(INCOMPLETE_PREFIX) or entry.name.startswith(CHECKPOINT_PREFIX)
                        or (path / MANIFEST_NAME).exists() or (path / DCP_METADATA).exists()):
                    found.append(path)
        for pattern in _FILE_SUBDIRS:
            for sub in self.root.glob(pattern):
                if sub.is_dir() and not sub.is_symlink():
                    found += [p for p in sub.iterdir() if single_file.is_candidate(p.name)
                              and p.is_file() and not p.is_symlink()]
        return found

    def root_problem(self) -> str:
        """Why others could plant checkpoints in the root or replace it ("" when the root is private and so is
        every directory above it). Cached per store."""
        if self._root_problem is None:
            self._root_problem = trust.private_problem(self.root) or untrusted.ancestors_problem(self.root)
        return self._root_problem

    def foreign_refusal(self) -> str:
        """Why no foreign checkpoint may be adopted from this root at all ("" when one may, once its own files
        pass :meth:`refusal`): said before any of its files is read."""
        what = "a foreign checkpoint (no manifest signed by this campaign)"
        if not self.adopt_foreign:
            return f"refused {what}: adopt_foreign_checkpoints is false (fix: {trust.ADOPT_FIX_DISABLED})"
        problem = self.root_problem()
        if problem:
            return f"refused {what}: {problem}, so someone else could have planted it (fix: {trust.adopt_fix(self.root)})"
        return ""

    def refusal(self, v: Validation) -> str:
        """Why a usable checkpoint may not be adopted here, or "" when it may (one line, naming the fix): a foreign
        one only when nobody but the user could have written any of it (``untrusted.tree_problem``)."""
        if not v.usable or v.trust == trust.SIGNED:
            return ""
        problem = self.foreign_refusal()
        if problem:
            return problem
        problem = untrusted.tree_problem(self.root, v.path)
        if problem:
            return (f"refused a foreign checkpoint (no manifest signed by this campaign): {problem}, so someone else "
                    f"could have written it (fix: {trust.adopt_fix(self.root)})")
        return ""

    def _judged(self, v: Validation) -> Validation:
        reason = self.refusal(v)
        if reason:
            return dataclasses.replace(v, status=REFUSED, reason=reason)
        return v

    def list(self, full: bool = False) -> list[CheckpointInfo]:
        """Every checkpoint with its status, newest (highest step) first."""
        infos = [CheckpointInfo.from_validation(self.validate(p, full)) for p in self._candidates()]
        return sorted(infos, key=_newest_first)

    def validate(self, path: str | os.PathLike[str], full: bool = False) -> Validation:
        """Validate one checkpoint, and judge whether it may be adopted here (status "refused" if not)."""
        return self._judged(validate_checkpoint(Path(path), full, key=self.key, foreign=self.foreign_refusal()))

    def newest_valid(self, full: bool = False, quarantine: bool = True,
                     allow_unverified: bool = True) -> CheckpointInfo | None:
        """The newest usable checkpoint, quarantining invalid ones found on the way (when ``quarantine``).

        Candidates are tried newest first, so a torn or corrupt newest checkpoint falls back to the
        previous one. Adopted DCP directories ("unverified") count as usable unless ``allow_unverified``
        is False. Incomplete temp dirs are never chosen and never moved (a save may be in progress).
        """
        # Validate lazily, newest first by the step in the name: the common case reads one checkpoint.
        for path in sorted(self._candidates(), key=_name_order):
            if path.name.startswith(INCOMPLETE_PREFIX):
                continue
            v = self.validate(path, False)
            if v.status in (VALID, UNVERIFIED) and full:
                v = self.validate(path, True)
            if v.status == REFUSED:  # newer than the one chosen: the caller may want to say why it was skipped
                self.refused.append(CheckpointInfo.from_validation(v))
            if v.status == INVALID:
                if quarantine:
                    self._try_quarantine(v.path, v.reason)
                continue
            if v.status == VALID or (allow_unverified and v.usable):
                return CheckpointInfo.from_validation(v)
        return None

    # -- quarantine ------------------------------------------------------------------------------------
    def quarantine(self, path: str | os.PathLike[str], reason: str) -> Path:
        """Move ``path`` into ``ROOT/quarantine/`` with a reason file; never deletes anything.

        The root may be writable by others (docs/security.md): every step goes through directory descriptors
        opened without following links, so a planted ``quarantine`` link or reason file can never carry the move
        or the reason to another place; a ``quarantine`` that is not the user's own directory is refused."""
        src = Path(path)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        q_fd = self._quarantine_fd()
        src_fd = os.open(src.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            single = stat.S_ISREG(os.lstat(src.name, dir_fd=src_fd).st_mode)
            name = _free_name(q_fd, f"{src.name}-{stamp}")
            if single:  # a single-file checkpoint: kept in a folder of its own
                os.mkdir(name, 0o700, dir_fd=q_fd)
                dst_fd = _open_dir(name, q_fd)
                try:
                    os.rename(src.name, src.name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
                    os.fsync(dst_fd)
                finally:
                    os.close(dst_fd)
            else:
                os.rename(src.name, name, src_dir_fd=src_fd, dst_dir_fd=q_fd)
            os.fsync(q_fd)
            os.fsync(src_fd)
            dst_fd = _open_dir(name, q_fd)
            try:
                _write_reason(dst_fd, f"{reason}\nquarantined-at: {stamp}\nfrom: {src}\n".encode())
            finally:
                os.close(dst_fd)
        finally:
            os.close(src_fd)
            os.close(q_fd)
        return self.root / QUARANTINE_DIR / name

    def _quarantine_fd(self) -> int:
        """``ROOT/quarantine``, created if missing, opened without following a link; it must be the user's."""
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            try:
                os.mkdir(QUARANTINE_DIR, 0o700, dir_fd=root_fd)
            except FileExistsError:
                pass
            q_fd = _open_dir(QUARANTINE_DIR, root_fd)
        finally:
            os.close(root_fd)
        st = os.fstat(q_fd)
        if st.st_uid != os.geteuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            os.close(q_fd)
            raise untrusted.UntrustedFileError(errno.EPERM, "is not this user's own directory",
                                               str(self.root / QUARANTINE_DIR))  # fmt: skip
        return q_fd

    def _try_quarantine(self, path: Path, reason: str) -> None:
        try:
            self.quarantine(path, reason)
        except OSError:
            pass  # a read-only root must not stop us from finding an older valid checkpoint

    def quarantined(self) -> builtins.list[QuarantinedInfo]:
        """What ``ROOT/quarantine`` holds (nothing when it is not the user's own directory)."""
        try:
            q_fd = self._quarantine_fd() if (self.root / QUARANTINE_DIR).exists() else None
        except OSError:
            return []
        if q_fd is None:
            return []
        os.close(q_fd)
        qdir = self.root / QUARANTINE_DIR
        out = []
        for entry in sorted(qdir.iterdir()):
            try:
                text = untrusted.read_regular(entry / REASON_FILE, untrusted.MAX_SMALL_BYTES)
                reason = text.decode(errors="replace").splitlines()[0]
            except (OSError, IndexError):
                reason = "(no reason recorded)"
            out.append(QuarantinedInfo(entry, reason))
        return out

    # -- pointers and retention (used by the committing rank) -------------------------------------------
    def set_latest(self, name: str) -> None:
        """Point ``LATEST`` at a committed checkpoint; callers do this only after the commit is durable."""
        write_durable(self.root / LATEST_FILE, f"{name}\n".encode())

    def apply_retention(self, keep_last: int, keep_every: int = 0) -> builtins.list[Path]:
        """Delete old *valid* committed checkpoints per policy, and incomplete temps older than the newest.

        Invalid ones are left for quarantine, adopted ones are not ours to delete, and the newest valid
        checkpoint always survives. Returns the paths removed.
        """
        infos = self.list()
        valid = [i for i in infos if i.status == VALID and i.step is not None
                 and i.path.name.startswith(CHECKPOINT_PREFIX)]
        if not valid:
            return []
        doomed_steps = set(steps_to_delete([i.step for i in valid if i.step is not None], keep_last, keep_every))
        newest_time = max(i.time or 0.0 for i in valid)
        doomed = [i.path for i in valid if i.step in doomed_steps]
        doomed += [i.path for i in infos if i.status == INCOMPLETE and (i.time or 0.0) < newest_time]
        for path in doomed:
            # Rename first: a crash mid-delete leaves an "incomplete" dir, never a torn step_* one.
            if not path.name.startswith(INCOMPLETE_PREFIX):
                gone = path.with_name(f"{INCOMPLETE_PREFIX}deleted-{path.name}")
                try:
                    os.rename(path, gone)
                    path = gone
                except OSError:
                    continue
            shutil.rmtree(path, ignore_errors=True)
        if doomed:
            fsync_path(self.root)
        return doomed


def _name_order(path: Path) -> tuple[int, str]:
    if single_file.is_candidate(path.name):
        step = single_file.step_from_file_name(path.name)
        if step is None:  # last.ckpt: the step recorded inside (read from the pickle's opcodes, never loaded)
            try:
                step = single_file.check_file(path).step
            except single_file.FormatError:
                step = None
    else:
        step = step_from_name(path.name)
    return (-(step if step is not None else -1), path.name)


def _newest_first(info: CheckpointInfo) -> tuple[int, float, str]:
    return (-(info.step if info.step is not None else -1), -(info.time or 0.0), info.path.name)


def _open_dir(name: str, dir_fd: int) -> int:
    """A directory inside ``dir_fd``, opened without following a link (a planted link raises)."""
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)


def _free_name(dir_fd: int, base: str) -> str:
    """``base``, or ``base-2``, ``base-3``... : the first name not taken in the directory."""
    name, n = base, 1
    while True:
        try:
            os.lstat(name, dir_fd=dir_fd)
        except FileNotFoundError:
            return name
        n += 1
        name = f"{base}-{n}"


def _write_reason(dir_fd: int, text: bytes) -> None:
    """The reason file, created fresh (a planted one, a link included, is removed first, never written through)."""
    try:
        os.unlink(REASON_FILE, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    fd = os.open(REASON_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                 dir_fd=dir_fd)  # fmt: skip
    try:
        os.write(fd, text)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.fsync(dir_fd)

"""A directory of checkpoints: list them with a status, pick the newest valid, quarantine bad ones.

The supervisor uses this before every (re)start to fill ``SUPERVISOR_RESUME_FROM``; it never imports
torch and never deletes an invalid checkpoint - it moves it into ``ROOT/quarantine/`` with a reason.
"""

from __future__ import annotations

import builtins
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from supervisor.checkpoint.durable import fsync_path, rename_durable, write_durable
from supervisor.checkpoint.manifest import MANIFEST_NAME
from supervisor.checkpoint.retention import steps_to_delete
from supervisor.checkpoint.validate import (
    DCP_METADATA,
    INCOMPLETE,
    INCOMPLETE_PREFIX,
    INVALID,
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


class CheckpointStore:
    """Checkpoints under ``root``: committed ``step_*`` dirs, adopted DCP dirs and ``.incomplete-*`` temps."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    # -- discovery -------------------------------------------------------------------------------------
    def _candidates(self) -> list[Path]:
        found: list[Path] = []
        with os.scandir(self.root) as it:
            for entry in it:
                if entry.name == QUARANTINE_DIR or entry.is_symlink() or not entry.is_dir():
                    continue
                path = Path(entry.path)
                if (entry.name.startswith(INCOMPLETE_PREFIX) or entry.name.startswith(CHECKPOINT_PREFIX)
                        or (path / MANIFEST_NAME).exists() or (path / DCP_METADATA).exists()):
                    found.append(path)
        return found

    def list(self, full: bool = False) -> list[CheckpointInfo]:
        """Every checkpoint-like directory with its status, newest (highest step) first."""
        infos = [CheckpointInfo.from_validation(validate_checkpoint(p, full)) for p in self._candidates()]
        return sorted(infos, key=_newest_first)

    def validate(self, path: str | os.PathLike[str], full: bool = False) -> Validation:
        return validate_checkpoint(Path(path), full)

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
            v = validate_checkpoint(path, False)
            if v.status == VALID and full:
                v = validate_checkpoint(path, True)
            if v.status == INVALID:
                if quarantine:
                    self._try_quarantine(v.path, v.reason)
                continue
            if v.status == VALID or (allow_unverified and v.usable):
                return CheckpointInfo.from_validation(v)
        return None

    # -- quarantine ------------------------------------------------------------------------------------
    def quarantine(self, path: str | os.PathLike[str], reason: str) -> Path:
        """Move ``path`` into ``ROOT/quarantine/`` with a reason file; never deletes anything."""
        src = Path(path)
        qdir = self.root / QUARANTINE_DIR
        qdir.mkdir(mode=0o700, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        dst = qdir / f"{src.name}-{stamp}"
        n = 1
        while dst.exists():
            n += 1
            dst = qdir / f"{src.name}-{stamp}-{n}"
        rename_durable(src, dst)
        write_durable(dst / REASON_FILE, f"{reason}\nquarantined-at: {stamp}\nfrom: {src}\n".encode())
        return dst

    def _try_quarantine(self, path: Path, reason: str) -> None:
        try:
            self.quarantine(path, reason)
        except OSError:
            pass  # a read-only root must not stop us from finding an older valid checkpoint

    def quarantined(self) -> builtins.list[QuarantinedInfo]:
        qdir = self.root / QUARANTINE_DIR
        if not qdir.is_dir():
            return []
        out = []
        for entry in sorted(qdir.iterdir()):
            try:
                reason = (entry / REASON_FILE).read_text(errors="replace").splitlines()[0]
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
    step = step_from_name(path.name)
    return (-(step if step is not None else -1), path.name)


def _newest_first(info: CheckpointInfo) -> tuple[int, float, str]:
    return (-(info.step if info.step is not None else -1), -(info.time or 0.0), info.path.name)

"""Decide whether one checkpoint (directory or single file) is usable, without torch and without unpickling.

Quick validation: manifest present and parseable, every listed file present, confined to the directory
and of the recorded size, and the files torch unpickles (``.metadata``) hashed. Full validation adds every
hash (parallel workers). A DCP directory without our manifest, or a single ``.ckpt``/``.pt`` file, gets the
checks its format allows and the weaker status "unverified". Whether a checkpoint may be *trusted*
(authenticated manifest, private root) is the store's call, from ``Validation.trust`` (see trust.py).
"""

from __future__ import annotations

import os
import pickletools
import re
import stat
from dataclasses import dataclass
from pathlib import Path

from supervisor.checkpoint import single_file, trust, untrusted
from supervisor.checkpoint.hashing import available, hash_file, hash_files
from supervisor.checkpoint.manifest import (
    MANIFEST_NAME,
    Manifest,
    ManifestError,
    check_relative_path,
    parse_manifest,
)

INCOMPLETE_PREFIX = ".incomplete-"
DCP_METADATA = ".metadata"
MAX_MANIFEST_BYTES = 256 << 20
MAX_METADATA_BYTES = 256 << 20  # a DCP .metadata: the plan of every shard (tens of MB for the largest models)

VALID, INVALID, INCOMPLETE, UNVERIFIED = "valid", "invalid", "incomplete", "unverified"
REFUSED = "refused"  # usable by its format, but foreign and not adoptable here (the store decides)
STATUSES = (VALID, INVALID, INCOMPLETE, UNVERIFIED, REFUSED)


@dataclass(frozen=True)
class Validation:
    path: Path
    status: str  # one of STATUSES
    reason: str  # why it is not valid; for "unverified", what was (not) checked
    step: int | None = None
    time: float | None = None
    size_bytes: int = 0
    full: bool = False  # True when hashes were checked
    manifest: Manifest | None = None
    trust: str = trust.FOREIGN  # "signed": manifest authenticated with this campaign's key; else "foreign"

    @property
    def usable(self) -> bool:
        """Can training resume from it? (valid, or an adopted layout that passed its structural checks)."""
        return self.status in (VALID, UNVERIFIED)


def step_from_name(name: str) -> int | None:
    """The step encoded in a directory name (``step_000100``, ``checkpoint-100``, ``iter_100``...), if any."""
    match = (re.search(r"(?:step|iter|iteration|checkpoint|ckpt)[_-]?(\d+)", name, re.IGNORECASE)
             or re.search(r"(\d+)(?!.*\d)", name))
    return int(match.group(1)) if match else None


def validate_checkpoint(path: Path, full: bool = False, threads: int | None = None,
                        key: bytes | None = None, foreign: str = "") -> Validation:
    """Validate the checkpoint ``path`` (a directory, or a single file); never raises for a bad checkpoint.

    ``key``: the campaign's manifest key; a manifest signed with it is checked (forged = invalid) and
    gets ``trust == "signed"``. ``foreign``: why a checkpoint this campaign did not sign may not be adopted here
    (the store's call), "" when it may: such a one is refused before any of its files is read or hashed.
    """
    path = Path(path)
    if path.name.startswith(INCOMPLETE_PREFIX):
        return Validation(path, INCOMPLETE, "save did not finish (in progress, or left by a crash)",
                          step_from_name(path.name), _mtime(path))
    if path.is_file() and not path.is_symlink() and single_file.is_candidate(path.name):
        if foreign:
            return Validation(path, REFUSED, foreign, single_file.step_from_file_name(path.name), _mtime(path))
        return validate_single_file(path, full)
    if not path.is_dir():
        return Validation(path, INVALID, "not a directory")
    manifest_path = path / MANIFEST_NAME
    if not manifest_path.exists() and not manifest_path.is_symlink():
        if (path / DCP_METADATA).exists():
            if foreign:
                return Validation(path, REFUSED, foreign, step_from_name(path.name), _mtime(path))
            return _validate_dcp_structure(path)
        return Validation(path, INVALID, f"no {MANIFEST_NAME}: the save never committed", step_from_name(path.name),
                          _mtime(path))
    try:
        manifest = _read_manifest(path)
    except (OSError, ManifestError) as err:
        return Validation(path, INVALID, f"{MANIFEST_NAME}: {err}", step_from_name(path.name), _mtime(path))
    base = (manifest.step, manifest.time, manifest.size_bytes)
    trusted = trust.check_auth(manifest.raw, manifest.auth, key)
    if trusted == trust.FOREIGN and foreign:
        return Validation(path, REFUSED, foreign, *base, manifest=manifest)
    if trusted == trust.FORGED:
        return Validation(path, INVALID, f"{MANIFEST_NAME} fails its authentication with this campaign's key "
                          "(forged or altered)", *base, manifest=manifest)
    problem, files = _check_files_quick(path, manifest)
    if not problem:
        problem = _check_pickled(path, manifest, trusted)
    if problem:
        return Validation(path, INVALID, problem, *base, full=False, manifest=manifest, trust=trusted)
    if full and not available(manifest.hash_algorithm):
        return Validation(path, VALID, f"sizes checked but not hashes: {manifest.hash_algorithm} is not available "
                          "here (pip install crc32c)", *base, full=False, manifest=manifest, trust=trusted)
    if full:
        problem = _check_hashes(files, manifest, threads)
        if problem:
            return Validation(path, INVALID, problem, *base, full=True, manifest=manifest, trust=trusted)
    return Validation(path, VALID, "", *base, full=full, manifest=manifest, trust=trusted)


def _check_pickled(path: Path, manifest: Manifest, trusted: str) -> str:
    """Hash the files torch unpickles in full (``.metadata``), even in a quick validation: SHA-256 from the
    authenticated ``auth`` field when signed, else the manifest's own hash (integrity only)."""
    sha = (manifest.auth or {}).get("sha256", {}) if trusted == trust.SIGNED else {}
    for entry in manifest.files:
        if not trust.is_pickled(entry.path):
            continue
        target = path / entry.path
        try:
            if trusted == trust.SIGNED:
                if entry.path not in sha:
                    return f"file {entry.path!r} is unpickled on load but has no authenticated SHA-256"
                if trust.sha256_file(target) != sha[entry.path]:
                    return f"file {entry.path!r} does not match its authenticated SHA-256 (altered)"
            elif available(manifest.hash_algorithm) and hash_file(target, manifest.hash_algorithm)[1] != entry.hash:
                return f"file {entry.path!r} {manifest.hash_algorithm} mismatch (corrupt)"
        except (OSError, ValueError) as err:
            return f"file {entry.path!r} cannot be hashed ({err})"
    return ""


def validate_single_file(path: Path, full: bool = False) -> Validation:
    """A single-file checkpoint (``.ckpt``/``.pt``): format checks only, never unpickled; "unverified"."""
    when = _mtime(path)
    size = path.stat().st_size if when is not None else 0
    step = single_file.step_from_file_name(path.name)
    try:
        checked = single_file.check_file(path, full)
    except single_file.FormatError as err:
        return Validation(path, INVALID, f"single-file checkpoint {err}", step, when, size)
    if step is None:
        step = checked.step
    return Validation(path, UNVERIFIED, f"no {MANIFEST_NAME}: {checked.detail}", step, when, size,
                      full=full and checked.kind == "torch-zip")


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def _read_manifest(path: Path) -> Manifest:
    """The manifest, read only when it is a regular file (not a link, a FIFO or a device) of a sane size."""
    try:
        data = untrusted.read_regular(path / MANIFEST_NAME, MAX_MANIFEST_BYTES)
    except untrusted.UntrustedFileError as err:
        raise ManifestError(err.strerror or "cannot be read safely") from None
    return parse_manifest(data)


def _resolve_confined(root_real: str, path: Path, rel: str) -> str:
    """Resolve a listed path that is not a plain file in the directory (nested, or a symlink), confined.

    Returns the real path, or raises ManifestError saying why the file is unusable.
    """
    candidate = os.path.join(path, rel)
    if not os.path.lexists(candidate):
        raise ManifestError(f"file {rel!r} is missing")
    real = os.path.realpath(candidate)
    if not real.startswith(root_real + os.sep):
        raise ManifestError(f"file {rel!r} resolves outside the checkpoint directory (symlink escape)")
    return real


def _stat_listed(root_real: str, path: Path, rel: str, entries: dict[str, os.DirEntry[str]]
                 ) -> tuple[str, os.stat_result]:
    entry = entries.get(rel)  # names with "/" are never direct entries
    if entry is not None and not entry.is_symlink():
        return entry.path, entry.stat(follow_symlinks=False)  # the common, fast case: a plain file here
    real = _resolve_confined(root_real, path, rel)
    try:
        return real, os.stat(real)
    except OSError as err:
        raise ManifestError(f"file {rel!r} cannot be read ({err.strerror})") from None


def _check_files_quick(path: Path, manifest: Manifest) -> tuple[str, list[str]]:
    root_real = os.path.realpath(path)
    with os.scandir(path) as it:
        entries = {e.name: e for e in it}
    files: list[str] = []
    for entry in manifest.files:
        try:
            real, st = _stat_listed(root_real, path, entry.path, entries)
        except ManifestError as err:
            return str(err), []
        except OSError as err:
            return f"file {entry.path!r} cannot be read ({err.strerror})", []
        if not stat.S_ISREG(st.st_mode):
            return f"file {entry.path!r} is not a regular file", []
        if st.st_size != entry.size:
            return f"file {entry.path!r} has {st.st_size} bytes, manifest says {entry.size}", []
        files.append(real)
    return "", files


def _check_hashes(files: list[str], manifest: Manifest, threads: int | None) -> str:
    try:
        results = hash_files(files, manifest.hash_algorithm, threads)
    except OSError as err:
        return f"reading shards failed: {err}"
    for entry, (size, digest) in zip(manifest.files, results, strict=True):
        if size != entry.size:
            return f"file {entry.path!r} changed size while hashing ({size} bytes)"
        if digest != entry.hash:
            return f"file {entry.path!r} {manifest.hash_algorithm} mismatch (corrupt: {digest} != {entry.hash})"
    return ""


def dcp_referenced_files(metadata: bytes) -> set[str]:
    """Shard file names referenced by a DCP ``.metadata`` pickle, found by *parsing* its opcodes.

    ``pickletools.genops`` only decodes the opcode stream; nothing is constructed or executed, so
    this is safe on untrusted bytes (unlike ``pickle.load``).
    """
    names: set[str] = set()
    for _op, arg, _pos in pickletools.genops(metadata):
        if isinstance(arg, str) and arg.endswith(".distcp"):
            names.add(arg)
    return names


def _validate_dcp_structure(path: Path) -> Validation:
    meta_path = path / DCP_METADATA
    step, when = step_from_name(path.name), _mtime(meta_path)
    try:
        data = untrusted.read_regular(meta_path, MAX_METADATA_BYTES)  # a FIFO or /dev/zero link: refused, not read
    except OSError as err:
        return Validation(path, INVALID, f"no {MANIFEST_NAME}; DCP .metadata unreadable ({err.strerror})", step, when)
    if not data:
        return Validation(path, INVALID, f"no {MANIFEST_NAME}; DCP .metadata is empty", step, when)
    try:
        referenced = dcp_referenced_files(data)
    except Exception as err:  # any parse failure of a hostile/torn pickle is a defect, not a crash
        return Validation(path, INVALID, f"no {MANIFEST_NAME}; DCP .metadata is not a readable pickle stream ({err})",
                          step, when)
    if not referenced:
        referenced = {p.name for p in path.glob("*.distcp")}
    if not referenced:
        return Validation(path, INVALID, f"no {MANIFEST_NAME}; DCP .metadata references no shard files", step, when)
    root_real = os.path.realpath(path)
    with os.scandir(path) as it:
        entries = {e.name: e for e in it}
    total = len(data)
    for rel in sorted(referenced):
        try:
            check_relative_path(rel)
            _real, st = _stat_listed(root_real, path, rel, entries)
        except ManifestError as err:
            return Validation(path, INVALID, f"no {MANIFEST_NAME}; DCP shard {err}", step, when)
        total += st.st_size
    return Validation(path, UNVERIFIED,
                      f"no {MANIFEST_NAME}: structural checks only (.metadata + {len(referenced)} shard files exist; "
                      "sizes and hashes not verifiable)", step, when, total)

"""The checkpoint manifest: a versioned JSON record written last, so its presence means "complete".

It lists every file of the checkpoint (relative path, size, hash), the training step, the commit time,
the world size and an environment fingerprint. It is JSON on purpose: the supervisor reads it without
torch and without ever unpickling anything.
"""

from __future__ import annotations

import json
import math
import posixpath
from dataclasses import dataclass, field
from typing import Any

from supervisor.checkpoint.hashing import ALGORITHMS

MANIFEST_NAME = "manifest.json"
FORMAT = "slurm-supervisor-checkpoint"
VERSION = 1


class ManifestError(ValueError):
    """The manifest is unreadable, malformed, or names a path outside its checkpoint."""


@dataclass(frozen=True)
class FileEntry:
    path: str  # relative, '/'-separated, confined to the checkpoint directory
    size: int
    hash: str


@dataclass(frozen=True)
class Manifest:
    step: int
    time: float  # commit wall time, seconds since the epoch
    world_size: int
    hash_algorithm: str
    files: tuple[FileEntry, ...]
    env: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    # The ``auth`` field (see trust.py) and the parsed document it covers; absent in unsigned manifests.
    auth: dict[str, Any] | None = field(default=None, compare=False)
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def size_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_doc(self) -> dict[str, Any]:
        """The JSON document (without ``auth``): what a MAC covers."""
        return json.loads(self.to_json(auth=False))

    def to_json(self, auth: bool = True) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "step": self.step,
            "time": self.time,
            "world_size": self.world_size,
            "hash_algorithm": self.hash_algorithm,
            "total_bytes": self.size_bytes,
            "files": [{"path": f.path, "size": f.size, "hash": f.hash} for f in self.files],
            "env": self.env,
            "extra": self.extra,
        }
        if auth and self.auth is not None:
            doc["auth"] = self.auth
        return (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode()


def check_relative_path(path: object) -> str:
    """Return ``path`` if it is a plain relative path inside the checkpoint, else raise ManifestError.

    Rejects absolute paths, ``..`` components, empty/``.`` components, backslashes and NUL bytes, so a
    crafted manifest can never make the validator (or a loader) read outside the checkpoint directory.
    """
    if not isinstance(path, str) or not path:
        raise ManifestError(f"file path {path!r} is not a non-empty string")
    if "\x00" in path or "\\" in path:
        raise ManifestError(f"file path {path!r} contains a NUL byte or backslash")
    if path.startswith("/"):
        raise ManifestError(f"file path {path!r} is absolute")
    parts = path.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise ManifestError(f"file path {path!r} has an empty, '.' or '..' component")
    if posixpath.normpath(path) != path:
        raise ManifestError(f"file path {path!r} is not normalised")
    return path


def _field(doc: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    value = doc.get(name)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ManifestError(f"field {name!r} is missing or not {getattr(kind, '__name__', kind)}")
    return value


def parse_manifest(data: bytes) -> Manifest:
    """Parse and check a manifest; any defect raises ManifestError with a one-line reason, never anything else.

    Hostile JSON raises more than JSONDecodeError: RecursionError (deep nesting), ValueError (an int of
    over 4300 digits), OverflowError (such an int as a float); all are a ManifestError here.
    """
    try:
        return _parse(data)
    except ManifestError:
        raise
    except (ValueError, TypeError, OverflowError, RecursionError, MemoryError) as err:
        raise ManifestError(f"manifest is not readable ({err.__class__.__name__}: {str(err)[:200]})") from None


def _parse(data: bytes) -> Manifest:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ManifestError(f"manifest is not valid JSON ({err.__class__.__name__}: {err})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ManifestError(f"not a {FORMAT} manifest")
    version = doc.get("version")
    if version != VERSION:
        raise ManifestError(f"manifest version {version!r} is not supported (this tool reads {VERSION})")
    step = _field(doc, "step", int)
    when = float(_field(doc, "time", (int, float)))
    world = _field(doc, "world_size", int)
    algo = _field(doc, "hash_algorithm", str)
    if step < 0 or world < 1 or not math.isfinite(when):
        raise ManifestError("step, world_size or time is out of range")
    if algo not in ALGORITHMS:
        raise ManifestError(f"unknown hash algorithm {algo!r}")
    raw_files = _field(doc, "files", list)
    files: list[FileEntry] = []
    seen: set[str] = set()
    for raw in raw_files:
        if not isinstance(raw, dict):
            raise ManifestError("a files entry is not an object")
        path = check_relative_path(raw.get("path"))
        size, digest = raw.get("size"), raw.get("hash")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0 or not isinstance(digest, str):
            raise ManifestError(f"file entry {path!r} has a bad size or hash")
        if path in seen or path == MANIFEST_NAME:
            raise ManifestError(f"file entry {path!r} is duplicated or names the manifest itself")
        seen.add(path)
        files.append(FileEntry(path, size, digest))
    env = doc.get("env") or {}
    extra = doc.get("extra") or {}
    if not isinstance(env, dict) or not isinstance(extra, dict):
        raise ManifestError("fields 'env' and 'extra' must be objects")
    auth = doc.get("auth")
    if auth is not None and not isinstance(auth, dict):
        raise ManifestError("field 'auth' must be an object")
    return Manifest(step, when, world, algo, tuple(files), env, extra, auth, doc)

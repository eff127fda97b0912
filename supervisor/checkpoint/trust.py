"""Who may have written a checkpoint: manifests authenticated with the campaign secret, private roots.

Why: resuming loads the checkpoint with torch, and torch *unpickles* parts of it (DCP's ``.metadata``
with plain ``pickle.load``, non-tensor items with ``torch.load(weights_only=False)``): whoever can put
a checkpoint where the supervisor picks one gets code execution in every rank (docs/security.md).
Two defences, both without unpickling anything:

- A manifest written under supervision carries an HMAC-SHA256 made with a key derived from the
  campaign's 0600 secret (the ranks run as the same user and find it through ``SUPERVISOR_CAMPAIGN``),
  and the SHA-256 of every file torch unpickles unconditionally (``*.metadata``), checked even by the
  quick validation. A forged or altered manifest fails; a copied one cannot cover new ``.metadata``.
- Anything else is *foreign* (no manifest, a manifest of another campaign or of an unsupervised run,
  a single-file ``.ckpt``/``.pt``): it is adopted only from a *private* root (owned by this user, not
  writable by group or others), and only while ``[run] adopt_foreign_checkpoints`` is true.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from pathlib import Path
from typing import Any

CAMPAIGN_ENV = "SUPERVISOR_CAMPAIGN"
AUTH_ALG = "hmac-sha256"
_CONTEXT = b"slurm-supervisor checkpoint manifest v1"

ADOPT_FIX_DISABLED = "set [run] adopt_foreign_checkpoints = true, or save with CheckpointSaver under supervision"


def adopt_fix(root: str | os.PathLike[str]) -> str:
    """The advice that closes the hole: signed checkpoints are checked wherever they are; an unsigned one is safe
    only in a tree nobody else can write (the root's own files included, not only the root)."""
    return (f"save with supervisor.checkpoint.CheckpointSaver under supervision (a signed checkpoint is verified "
            f"wherever it is), or keep checkpoints under a directory only you can write, with everything in it: "
            f"chmod -R go-w {root}, on a path whose every directory above is yours or root's and not writable by "
            f"others")


def manifest_key(secret: bytes) -> bytes:
    """The manifest key: derived from (never equal to) the campaign secret, so each use has its own key."""
    return hmac.new(secret, _CONTEXT, hashlib.sha256).digest()


def key_id(key: bytes) -> str:
    """A public name for the key, so a manifest of another campaign is told from a forged one."""
    return hashlib.sha256(b"key-id:" + key).hexdigest()[:16]


def campaign_key(campaign_dir: str | os.PathLike[str] | None) -> bytes | None:
    """The manifest key of a campaign (from its 0600 ``secret``), or None when there is none to read."""
    if not campaign_dir:
        return None
    from supervisor.errors import SupervisorError
    from supervisor.heartbeat.secret import SECRET_NAME, load_secret

    try:
        return manifest_key(load_secret(Path(campaign_dir) / SECRET_NAME))
    except SupervisorError:
        return None


def key_from_env() -> bytes | None:
    """Training side: the key of the campaign supervising this process (None when unsupervised)."""
    return campaign_key(os.environ.get(CAMPAIGN_ENV))


def canonical(doc: dict[str, Any]) -> bytes:
    """The bytes a MAC covers: the manifest without its ``auth`` field, in one fixed JSON spelling."""
    body = {k: v for k, v in doc.items() if k != "auth"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def mac(key: bytes, doc: dict[str, Any], sha256: dict[str, str]) -> str:
    message = canonical(doc) + b"\n" + json.dumps(sha256, sort_keys=True, separators=(",", ":")).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def make_auth(key: bytes, doc: dict[str, Any], sha256: dict[str, str]) -> dict[str, Any]:
    """The ``auth`` field of a manifest: key id, the SHA-256 of the unpickled files, and the MAC over both."""
    return {"alg": AUTH_ALG, "key_id": key_id(key), "sha256": dict(sha256), "mac": mac(key, doc, sha256)}


SIGNED, FOREIGN, FORGED = "signed", "foreign", "forged"


def check_auth(doc: dict[str, Any], auth: object, key: bytes | None) -> str:
    """``signed`` (our key, MAC good), ``forged`` (our key id, MAC bad) or ``foreign`` (unsigned, other key)."""
    if key is None or not isinstance(auth, dict) or auth.get("alg") != AUTH_ALG:
        return FOREIGN
    if auth.get("key_id") != key_id(key):
        return FOREIGN
    sha = auth.get("sha256")
    given = auth.get("mac")
    if not isinstance(sha, dict) or not isinstance(given, str) or not given.isascii() or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in sha.items()):
        return FORGED
    try:
        expected = mac(key, doc, sha)
    except (ValueError, TypeError, RecursionError):
        return FORGED
    return SIGNED if hmac.compare_digest(expected, given) else FORGED


def private_problem(path: str | os.PathLike[str]) -> str:
    """Why others could write ``path`` (owned by someone else, or group/other-writable), or "" if private."""
    try:
        st = os.stat(path)
    except OSError as err:
        return f"{path} cannot be examined ({err.strerror})"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def sha256_file(path: str | os.PathLike[str], limit: int = 1 << 30) -> str:
    """SHA-256 of a small file (``.metadata``): a regular file (not a FIFO or a device, checked on the opened
    descriptor), of at most ``limit`` bytes (else ValueError)."""
    from supervisor.checkpoint.untrusted import open_regular

    digest = hashlib.sha256()
    with os.fdopen(open_regular(path, limit, follow=True), "rb") as f:
        total = 0
        while chunk := f.read(1 << 20):
            total += len(chunk)
            if total > limit:
                raise ValueError(f"{path} is larger than {limit} bytes")
            digest.update(chunk)
    return digest.hexdigest()


def is_pickled(relative_path: str) -> bool:
    """Files torch unpickles in full when loading a DCP checkpoint (``.metadata``, ``__N.metadata``)."""
    return relative_path.rsplit("/", 1)[-1].endswith(".metadata")

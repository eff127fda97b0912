"""What changed in the environment between a checkpoint and the launch resuming from it. Pure.

Why: a run that resumes "fine" and then diverges, slows down or hangs after weeks is often a different torch, CUDA,
NCCL or driver, other code, or another world size than the one that wrote the checkpoint (a module update on the
cluster, a ``git pull`` in the working tree, fewer nodes after a loss). Every manifest stores the writer's
fingerprint (``checkpoint/fingerprint.py``); the supervisor reads the relaunch's own (``driver/env_now.py``) and
journals, alerts (L2) and reports each difference. A field missing on either side is unknown, never a difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# (field, what to call it): the fields compared, in the order they are said
FIELDS = (
    ("python", "Python"), ("torch", "torch"), ("cuda", "CUDA"), ("nccl", "NCCL"), ("driver", "NVIDIA driver"),
    ("git_commit", "code (git commit)"), ("world_size", "world size"),
)  # fmt: skip


def _value(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float, str)):
        text = str(value).strip()
        return text[:80] if text else None
    return None


def drift(saved: Mapping[str, Any], now: Mapping[str, Any]) -> tuple[str, ...]:
    """One line per field both sides know and that differs: ``torch 2.4.1 -> 2.5.0``."""
    out = []
    for key, name in FIELDS:
        before, after = _value(saved, key), _value(now, key)
        if before is not None and after is not None and before != after:
            if key == "git_commit":
                before, after = before[:12], after[:12]
            out.append(f"{name} {before} -> {after}")
    return tuple(out)

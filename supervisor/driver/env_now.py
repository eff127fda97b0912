"""The relaunch's own environment, compared with the one that wrote the checkpoint it resumes from.

The supervisor never imports torch: it asks the campaign's interpreter (the one the ranks run) for its Python,
torch, CUDA (read from torch's ``version.py``, not imported) and NCCL package versions, reads the NVIDIA driver's
version and the working tree's git commit itself, and takes the world size from the launch. Asked once per attempt,
at the first launch that resumes from a checkpoint with a manifest (``checkpoint/fingerprint.py`` wrote the
writer's side). Each difference (``decisions/env_drift.py``) is journaled (``env_changed``), alerted (L2) and shown
by ``supervise report``; a checkpoint's differences are said once per attempt.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog

from supervisor.checkpoint.fingerprint import driver_version, git_commit
from supervisor.checkpoint.manifest import MANIFEST_NAME, ManifestError, parse_manifest
from supervisor.decisions import events as ev
from supervisor.decisions.env_drift import drift
from supervisor.driver.context import Context

log = structlog.get_logger("supervisor")

PROBE_TIMEOUT_S = 30.0
MAX_MANIFEST_BYTES = 16 << 20
# Run by the campaign's interpreter: versions from package metadata and torch's version.py, nothing imported.
PROBE = r"""
import importlib.metadata as m, importlib.util, json, os, re, sys
out = {"python": sys.version.split()[0]}
try:
    out["torch"] = m.version("torch")
    spec = importlib.util.find_spec("torch")
    text = open(os.path.join(os.path.dirname(spec.origin), "version.py")).read()
    found = re.search(r"^cuda(?::[^=]*)?=\s*['\"]([0-9.]+)['\"]", text, re.M)
    if found:
        out["cuda"] = found.group(1)
except Exception:
    pass
for name in ("nvidia-nccl-cu13", "nvidia-nccl-cu12", "nvidia-nccl-cu11"):
    try:
        out["nccl"] = m.version(name)
        break
    except Exception:
        pass
print(json.dumps(out))
"""


def probe(python: str, cwd: str | None) -> dict[str, Any]:
    """The campaign interpreter's versions, the driver's and the working tree's commit; {} parts when unknown."""
    now: dict[str, Any] = {}
    try:
        out = subprocess.run([python, "-c", PROBE], capture_output=True, timeout=PROBE_TIMEOUT_S, cwd=cwd or None,  # noqa: S603
                             check=False, stdin=subprocess.DEVNULL)  # fmt: skip
        doc = json.loads(out.stdout[:65536]) if out.returncode == 0 else {}
        now.update({k: v for k, v in doc.items() if k in ("python", "torch", "cuda", "nccl") and isinstance(v, str)})
    except (OSError, ValueError, subprocess.SubprocessError) as err:
        log.warning("env_probe_failed", python=python, error=str(err)[:200])
    now["driver"] = driver_version()
    now["git_commit"] = git_commit(Path(cwd) if cwd else None)
    return now


def saved_fingerprint(checkpoint: str) -> dict[str, Any] | None:
    """The writer's fingerprint and world size from the checkpoint's manifest; None without one (a plain torch.save
    file, a DCP directory) or when it cannot be read."""
    path = Path(checkpoint) / MANIFEST_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            manifest = parse_manifest(f.read(MAX_MANIFEST_BYTES))
    except (OSError, ManifestError, ValueError):
        return None
    return {**manifest.env, "world_size": manifest.world_size}


class EnvCheck:
    def __init__(self, ctx: Context, *, python: str, cwd: str | None,
                 alert: Callable[[str, tuple[str, ...], tuple[str, ...]], None],
                 probe_now: Callable[[str, str | None], Mapping[str, Any]] = probe) -> None:  # fmt: skip
        """``alert(checkpoint, differences, nodes)``: raise the L2 alert (``Notifier.env_changed``)."""
        self.ctx, self.python, self.cwd, self.alert, self.probe_now = ctx, python, cwd, alert, probe_now
        self.now: Mapping[str, Any] | None = None
        self.said: set[tuple[str, tuple[str, ...]]] = set()

    def resumed(self, checkpoint: str | None, nodes: tuple[str, ...], ranks_per_node: int | None) -> tuple[str, ...]:
        """A launch on ``nodes`` with ``ranks_per_node`` ranks on each (None: not known, e.g. torchrun workers whose
        count its options do not say) resumes from ``checkpoint``: the differences said (maybe none)."""
        if not checkpoint:
            return ()
        saved = saved_fingerprint(checkpoint)
        if saved is None:
            return ()
        if self.now is None:
            self.now = dict(self.probe_now(self.python, self.cwd))
        world = {"world_size": len(nodes) * ranks_per_node} if ranks_per_node else {}  # unknown: never a difference
        differences = drift(saved, {**self.now, **world})
        if differences and (checkpoint, differences) not in self.said:
            self.said.add((checkpoint, differences))
            self.ctx.record(ev.env_changed(self.ctx.clock(), checkpoint, differences))
            self.alert(checkpoint, differences, nodes)
        return differences

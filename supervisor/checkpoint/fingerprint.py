"""The environment fingerprint stored in each manifest: enough to explain a "resumed but diverged" run."""

from __future__ import annotations

import os
import platform
import re
import socket
import sys
from pathlib import Path
from typing import Any

# Env vars worth recording (never secrets: only names listed here are copied).
RECORDED_ENV = (
    "SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_RESTART_COUNT", "SLURM_NTASKS", "SLURM_JOB_NODELIST",
    "SLURM_CLUSTER_NAME", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "CUBLAS_WORKSPACE_CONFIG",
    "PYTHONHASHSEED", "SUPERVISOR_RESUME_FROM",
)


def git_commit(start: Path | None = None) -> str | None:
    """The commit checked out in the repository around ``start`` (cwd), read from .git without running git."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        git = d / ".git"
        if git.is_file():  # worktree or submodule: "gitdir: PATH"
            text = git.read_text(errors="replace").strip()
            if text.startswith("gitdir:"):
                git = (d / text.split(":", 1)[1].strip()).resolve()
        if not git.is_dir():
            continue
        try:
            head = (git / "HEAD").read_text().strip()
            if not head.startswith("ref:"):
                return head
            ref = head.split(":", 1)[1].strip()
            common = git
            if (git / "commondir").is_file():
                common = (git / (git / "commondir").read_text().strip()).resolve()
            for base in (git, common):
                if (base / ref).is_file():
                    return (base / ref).read_text().strip()
            packed = common / "packed-refs"
            if packed.is_file():
                for line in packed.read_text().splitlines():
                    if line.endswith(" " + ref):
                        return line.split(" ", 1)[0]
        except OSError:
            return None
        return None
    return None


def driver_version(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    """The NVIDIA kernel driver's version on this host (``NVRM version: ... Kernel Module  550.54.15 ...``)."""
    try:
        text = path.read_text(errors="replace")[:4096]
    except OSError:
        return None
    m = re.search(r"Kernel Module(?: for [a-z0-9_]+)?\s+([0-9]+(?:\.[0-9]+)+)", text)
    return m.group(1) if m else None


def torch_versions(torch: Any) -> dict[str, str | None]:
    """CUDA and NCCL as the running torch sees them (None on a CPU build or when it cannot say)."""
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    nccl = None
    try:
        if cuda and torch.cuda.is_available():
            found = torch.cuda.nccl.version()
            nccl = ".".join(map(str, found)) if isinstance(found, tuple) else str(found)
    except Exception:  # noqa: BLE001 - a fingerprint never fails a save
        nccl = None
    return {"cuda": str(cuda) if cuda else None, "nccl": nccl}


def fingerprint(torch_version: str | None = None, seeds: dict[str, Any] | None = None,
                versions: dict[str, str | None] | None = None) -> dict[str, Any]:  # fmt: skip
    """``versions``: CUDA and NCCL (:func:`torch_versions`)."""
    return {
        "python": sys.version.split()[0],
        "torch": torch_version,
        **(versions or {}),
        "driver": driver_version(),
        "platform": platform.platform(),
        "hostname": socket.gethostname(),
        "git_commit": git_commit(),
        "argv": list(sys.argv),
        "env": {k: os.environ[k] for k in RECORDED_ENV if k in os.environ},
        "seeds": dict(seeds or {}),
    }

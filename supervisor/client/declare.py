"""Telling the supervisor where the program saves its checkpoints (``client.saves_to(directory)``).

WHY: the supervisor finds the checkpoint directory in the training command's flags (``--ckpt-dir`` ...). A launch
through a wrapper (``bash train.sh``, a site's launcher script) names none, so resume would be off: a relaunch
after a node crash would start from step 0. The program's own saver knows the directory; it says so once, and the
supervisor scans it from then on, in this Slurm run and every later one. ``CheckpointSaver`` and the examples'
Lightning callback call it themselves; a plain ``torch.save`` script calls it once.

What it writes: ``<campaign>/checkpoint_dir.declared`` (JSON ``{"path": ..., "rank": ...}``, mode 0600, replaced
atomically), from rank 0 only (one program, one directory), only when it changes. Unsupervised: nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from supervisor import paths as _paths

CAMPAIGN_ENV = "SUPERVISOR_CAMPAIGN"  # set by the supervisor for every rank (the same as trust.CAMPAIGN_ENV)
MAX_PATH_BYTES = 4096


def _rank() -> int | None:
    for name in ("RANK", "SLURM_PROCID"):
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return None


def saves_to(directory: str | os.PathLike[str]) -> bool:
    """Tell the supervisor that checkpoints are saved under ``directory`` (relative: to the working directory).
    Returns True when the supervisor was told (rank 0 of a supervised program); False otherwise, nothing written.
    Never raises for the supervisor's sake: a campaign directory that cannot be written gives a warning once."""
    campaign = os.environ.get(CAMPAIGN_ENV)
    if not campaign or _rank() not in (0, None):
        return False
    path = os.path.abspath(os.fspath(directory))
    if "\x00" in path or "\n" in path or len(path.encode(errors="replace")) > MAX_PATH_BYTES:
        return False
    target = _paths.CampaignPaths(Path(campaign)).declared_checkpoint_dir
    text = json.dumps({"path": path, "rank": _rank()}) + "\n"
    try:
        if target.is_file() and target.read_text() == text:
            return True
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, target)
    except OSError as exc:
        from supervisor.client import api

        api._warn_once("saves_to", f"cannot tell the supervisor where checkpoints are ({exc})",
                       "make the campaign directory writable, or set [run] checkpoint_dir")  # fmt: skip
        return False
    return True

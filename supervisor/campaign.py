"""The campaign directory (contract): create it at submit, load its spec at run.

The file names live in ``supervisor.paths`` (``CampaignPaths``). The directory is private (0700): it holds
the job secret.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any

from supervisor.errors import CampaignError
from supervisor.paths import CampaignPaths

SPEC_VERSION = 1


@dataclasses.dataclass(frozen=True)
class CampaignSpec:
    """What ``supervise run`` needs to (re)start the training, fixed at submit time."""

    command: tuple[str, ...]
    sbatch_flags: tuple[str, ...] = ()
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    cwd: str = ""
    python: str = ""
    created: float = 0.0
    version: int = SPEC_VERSION
    site_excluded: tuple[str, ...] = ()  # nodes submit left out for the site ledger (released once it forgives)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True) + "\n"


def _write_private(path: Path, text: str) -> None:
    """Write a 0600 file atomically (tmp + fsync + rename) so a crash never leaves half a spec."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def create(root: Path, spec: CampaignSpec, batch_script: str) -> CampaignPaths:
    """Create a new campaign directory; refuses to overwrite an existing campaign's spec."""
    paths = CampaignPaths(root.resolve())
    if paths.spec.exists():
        raise CampaignError(
            f"{paths.root} already holds a campaign",
            "pick a new --campaign directory (a campaign is resumed by its job, not by resubmitting)",
        )
    try:
        paths.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(paths.root, 0o700)
        for sub in (paths.logs, paths.stacks):
            sub.mkdir(mode=0o700, exist_ok=True)
        _write_private(paths.spec, spec.to_json())
        _write_private(paths.batch_script, batch_script)
    except OSError as err:
        raise CampaignError(f"cannot create campaign directory {paths.root}: {err.strerror}", "check the path") from None
    return paths


def load(root: str | Path) -> tuple[CampaignPaths, CampaignSpec]:
    paths = CampaignPaths(Path(root).resolve())
    try:
        data = json.loads(paths.spec.read_text())
    except FileNotFoundError:
        raise CampaignError(
            f"{paths.root} is not a campaign directory (no campaign.json)",
            "pass the directory that `supervise submit` printed",
        ) from None
    except (OSError, ValueError, RecursionError) as err:  # RecursionError: nesting deeper than the parser's stack
        raise CampaignError(f"cannot read {paths.spec}: {str(err)[:200]}", "check the campaign directory") from None
    if not isinstance(data, dict) or data.get("version") != SPEC_VERSION:
        raise CampaignError(
            f"{paths.spec} has an unsupported format version {data.get('version') if isinstance(data, dict) else '?'}",
            "use the supervise version that created this campaign",
        )
    fields = {f.name for f in dataclasses.fields(CampaignSpec)}
    kwargs = {k: v for k, v in data.items() if k in fields}
    problem = _spec_problem(kwargs)
    if problem:
        raise CampaignError(f"{paths.spec} is not a campaign spec this supervisor wrote ({problem})",
                            "restore it from a backup, or submit the campaign again") from None
    kwargs["command"] = tuple(kwargs.get("command", ()))
    kwargs["sbatch_flags"] = tuple(kwargs.get("sbatch_flags", ()))
    kwargs["site_excluded"] = tuple(kwargs.get("site_excluded", ()))
    return paths, CampaignSpec(**kwargs)


def _spec_problem(kwargs: dict[str, Any]) -> str:
    """What in a read campaign.json is not of the type ``submit`` writes ("" when all is)."""
    for name in ("command", "sbatch_flags", "site_excluded"):
        value = kwargs.get(name, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return f"{name} is not a list of strings"
    if not kwargs.get("command"):
        return "command is empty"
    if not isinstance(kwargs.get("config", {}), dict):
        return "config is not a table"
    for name in ("cwd", "python"):
        if not isinstance(kwargs.get(name, ""), str):
            return f"{name} is not a string"
    created = kwargs.get("created", 0.0)
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        return "created is not a number"
    return ""


def default_root(name: str, now: float | None = None) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return Path("campaigns") / f"{stamp}-{name}"

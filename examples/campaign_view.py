"""Read-only views of a campaign directory for scripts that drive or watch campaigns (the demo and benches).

They read only what the supervisor publishes (``journal.jsonl``, ``live.json``), never its internals. Not part of
the installed package: ``wait_for`` raises AssertionError, as a demo or a bench wants when the cluster misbehaves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def events(root: Path, kind: str | None = None) -> list[dict[str, Any]]:
    """The campaign's journal events (of one ``type`` if given); empty before the supervisor started."""
    from supervisor.journal import read

    path = Path(root) / "journal.jsonl"
    found = read(path) if path.exists() else []
    return found if kind is None else [e for e in found if e["type"] == kind]


def live_rank(root: Path, rank: int, min_step: int = 0) -> dict[str, Any] | None:
    """The live-table row of ``rank`` once it reached ``min_step`` and is still running, else None."""
    try:
        rows = json.loads((Path(root) / "live.json").read_text()).get("ranks", [])
    except (OSError, ValueError):
        return None
    for row in rows:
        if row.get("rank") == rank and (row.get("step") or 0) >= min_step and row.get("state") != "gone":
            return dict(row)
    return None


def wait_for(what: str, predicate: Callable[[], T | None], timeout: float, poll: float = 0.5) -> T:
    """Poll ``predicate`` until it returns something truthy; AssertionError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def job_nodes(job_id: str) -> tuple[str, list[str]]:
    """(batch host, nodes) of a running job, from the Slurm adapter; empty while it does not run."""
    from slurm.client import get_client

    job = get_client().job(job_id)
    if job is None or not job.is_running:
        return "", []
    return job.batch_host or "", list(job.nodes)

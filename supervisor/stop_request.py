"""A user's request to stop a campaign (``supervise cancel CAMPAIGN [--checkpoint]``), handed to the running
supervisor through a file in the campaign directory (shared with the batch host, as the journal is).

WHY a file and not only ``scancel``: scancel ends the job at once (SIGTERM, then SIGKILL after KillWait), with
no time for a save; the supervisor, told through the file, can first ask every rank to checkpoint, wait for the
save to commit, journal "cancelled by the user" and end the job itself, never requeued. The decision part is
pure; reading and writing the file is the thin edge.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.decisions import policy

FILE_NAME = "stop-request.json"
REASON = "cancelled by the user"


@dataclass(frozen=True)
class StopRequest:
    checkpoint: bool
    t: float


def path(root: Path) -> Path:
    return Path(root) / FILE_NAME


def write(root: Path, checkpoint: bool, t: float) -> Path:
    """Write the request atomically, private to the user (0600)."""
    target = path(root)
    tmp = target.with_name(f".{FILE_NAME}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"checkpoint": bool(checkpoint), "t": float(t)}, f)
    os.replace(tmp, target)
    return target


def read(root: Path) -> StopRequest | None:
    """The pending request, or None (no file; an unreadable or malformed one is still a request to stop)."""
    target = path(root)
    try:
        data = json.loads(target.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError):  # RecursionError: hostile deep nesting
        return StopRequest(checkpoint=False, t=0.0)
    if not isinstance(data, dict):
        return StopRequest(checkpoint=False, t=0.0)
    t = data.get("t")
    if not isinstance(t, (int, float)) or isinstance(t, bool) or not abs(t) < 1e300 or not math.isfinite(t):
        t = 0.0
    return StopRequest(checkpoint=data.get("checkpoint") is True, t=float(t))


def clear(root: Path) -> None:
    try:
        path(root).unlink()
    except FileNotFoundError:
        pass


def respond(request: StopRequest) -> tuple[cl.Interruption, policy.Decision]:
    """The interruption and decision for a user's stop: class ``cancelled``, nobody blamed, never requeued;
    with ``checkpoint`` every rank is first asked to save (and the save awaited)."""
    why = "supervise cancel" + (" --checkpoint" if request.checkpoint else "")
    interruption = cl.Interruption(ev.CANCELLED, (), 1.0, (f"{REASON} ({why})",))
    actions: list[policy.Action] = []
    if request.checkpoint:
        actions.append(policy.Action(policy.CHECKPOINT_NOW, "L1", (), REASON, {"checkpoint": True}))
    actions.append(policy.Action(policy.STOP, None, (), REASON, {"state": "stopped"}))
    return interruption, policy.Decision(tuple(actions), "stopped", REASON)

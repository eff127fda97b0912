"""The process state of a rank: one vocabulary for the agent, the wire codec, the live table, the pure
detectors and the driver.

The agent reads the state from /proc (psutil) and sends its code (one byte, the index in ``NAMES``); everything
after the wire speaks the names. ``meaning`` folds a name into what a detector may conclude from it.

``gone``: the pid vanished and, not being its parent, the agent cannot know the exit code (srun's exit status
tells it); ``exited`` is for a future parent-side agent; ``no_pid``: the rank's slot names no process yet.
Stdlib-only and import-free: the agent and the training-side tools may import it.
"""

from __future__ import annotations

UNKNOWN = "unknown"
RUNNING = "running"
SLEEPING = "sleeping"
DISK_WAIT = "disk_wait"
STOPPED = "stopped"
ZOMBIE = "zombie"
GONE = "gone"
EXITED = "exited"
NO_PID = "no_pid"

NAMES: tuple[str, ...] = (UNKNOWN, RUNNING, SLEEPING, DISK_WAIT, STOPPED, ZOMBIE, GONE, EXITED, NO_PID)
"""Wire codes: a state's code is its index here (never reorder, only append)."""
CODES: dict[str, int] = {name: code for code, name in enumerate(NAMES)}

ENDED = frozenset({ZOMBIE, GONE, EXITED})  # the process is over (its exit code may be known)
ABNORMAL = ENDED | {STOPPED, NO_PID}  # shown first in live.json: not a process making progress

# What a detector may conclude from a state.
ALIVE_MEANING = "alive"
STOPPED_MEANING = "stopped"
GONE_MEANING = "gone"


def name(code: int) -> str:
    """The name of a wire code; an unknown code (a newer agent) gets a placeholder, never an error."""
    return NAMES[code] if 0 <= code < len(NAMES) else f"state{code}"


def meaning(state: str | None) -> str:
    """``stopped``, ``gone`` or ``alive``: unknown states count as alive (only positive evidence raises alarms)."""
    if state == STOPPED:
        return STOPPED_MEANING
    if state in ENDED:
        return GONE_MEANING
    return ALIVE_MEANING

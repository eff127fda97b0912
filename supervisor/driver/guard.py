"""The loop never dies of one stage: an exception from a detector, the heartbeat channel (its ``live.json``
write), a checkpoint scan, a Slurm query or an actuator is journaled as ``supervisor_error`` {stage, error}
and supervision goes on with the stage's safe default.

WHY not let it propagate: the supervisor is the one process that keeps a multi-day campaign alive; a bug or a
surprise in one side duty (a loss of 1e160 overflowing a variance, an unwritable live.json, a webhook answering
garbage) must cost that duty one pass, never the campaign. The same error repeating every pass is journaled
once per ``REPEAT_S`` (with the count of repeats), so a persistent fault cannot flood the journal.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import structlog

from supervisor.decisions import events as ev

log = structlog.get_logger("supervisor")

T = TypeVar("T")

REPEAT_S = 300.0  # the same (stage, error) is journaled at most once per this many seconds

# Stage names (the ``stage`` field of ``supervisor_error``), documented in docs/decisions.md.
DETECT = "detect"
HEARTBEAT = "heartbeat"  # the channel's poll: receiving summaries, keepalives, the live.json write
CHECKPOINT_SCAN = "checkpoint_scan"  # manifests, the store's listing, quarantine
SLURM_QUERY = "slurm_query"
AGENTS = "agents"
METRICS = "metrics"
WARNING = "warning"  # the response to a warning detection (alerts, strikes)
HEALTH = "health"  # the node agents' health reports (journaling them, judging the launch's nodes)
PREFLIGHT = "preflight"  # the check before a launch (health reports, the collective test)
ACTION = "action"  # followed by ":<kind>", e.g. "action:alert"
EVIDENCE = "evidence"  # gathering the evidence of an ending (Slurm, the ranks, the log, health)
DECIDE = "decide"  # classify and policy on that evidence (the program's text among it is untrusted)
SITE = "site"  # the site-wide node ledger (asking it, telling it)


class Guard:
    """Runs a stage and turns its exception into a journaled ``supervisor_error`` and a default value."""

    def __init__(self, record: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.time) -> None:
        self.record, self.clock = record, clock
        self._last: dict[tuple[str, str], tuple[float, int]] = {}  # (stage, error) -> (journaled at, repeats)

    def call(self, stage: str, fn: Callable[..., T], *args: Any, default: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - the point: one stage's failure never ends supervision
            self.failed(stage, err)
            return default

    def failed(self, stage: str, err: BaseException) -> None:
        text = f"{type(err).__name__}: {err}"[:500]
        now = time.monotonic()
        key = (stage, text)
        last = self._last.get(key)
        if last is not None and now - last[0] < REPEAT_S:
            self._last[key] = (last[0], last[1] + 1)
            log.debug("supervisor_error_repeated", stage=stage, error=text)
            return
        repeats = last[1] if last is not None else 0
        self._last[key] = (now, 0)
        try:
            self.record(ev.supervisor_error(self.clock(), stage, text, repeats))
        except Exception as journal_err:  # noqa: BLE001 - the journal itself failing: say so on stderr, go on
            log.error("supervisor_error", stage=stage, error=text, journal_error=str(journal_err))


class GuardedChannel:
    """The heartbeat channel with ``poll`` guarded: a failing receive or ``live.json`` write is journaled and
    that poll counts as having received nothing. Everything else is the channel's own."""

    def __init__(self, channel: Any, guard: Guard) -> None:
        self._channel, self._guard = channel, guard
        self.table: Any = channel.table

    def poll(self, timeout: float) -> int:
        started = time.monotonic()
        got: int = self._guard.call(HEARTBEAT, self._channel.poll, timeout, default=-1)
        if got < 0:  # failed at once: keep the caller's pacing (its loops wait through poll)
            time.sleep(max(0.0, min(timeout, 0.1) - (time.monotonic() - started)))
            return 0
        return got

    def send(self, node: str, cmds: Sequence[Any]) -> bool:
        return bool(self._guard.call(HEARTBEAT, self._channel.send, node, cmds, default=False))

    def send_order(self, node: str, text: str) -> bool:
        return bool(self._guard.call(HEARTBEAT, self._channel.send_order, node, text, default=False))

    def write_address_file(self) -> Path:
        return self._channel.write_address_file()  # type: ignore[no-any-return]

    def close(self) -> None:
        self._channel.close()

    @property
    def address(self) -> tuple[str, int]:
        return self._channel.address  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:  # latest, counters...: the channel's own
        return getattr(self._channel, name)

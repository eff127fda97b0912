"""The journal as the driver writes it: every event is appended (fsynced) and kept in memory, so the pure
decision core can fold the campaign so far without reading the file again."""

from __future__ import annotations

from typing import Any

import structlog

from supervisor.journal import Journal

log = structlog.get_logger("supervisor")


class Recorder:
    def __init__(self, journal: Journal, history: list[dict[str, Any]] | None = None) -> None:
        self.journal = journal
        self.history: list[dict[str, Any]] = list(history or [])

    def record(self, event: dict[str, Any]) -> None:
        """Journal first, then act: a decision is durable before it is carried out."""
        self.journal.append(event)
        self.history.append(event)
        log.info(event["type"], **{k: v for k, v in event.items() if k not in ("type", "t", "v", "event")})

    def close(self) -> None:
        self.journal.close()

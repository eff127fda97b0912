"""The journal as the driver writes it: every event is appended (fsynced), then applied to the campaign state the
loop keeps (``campaign_state.CampaignState``), so the pure decision core reads the campaign so far without the
journal being read or folded again."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import structlog

from supervisor.decisions import campaign_state
from supervisor.decisions.ledger import LedgerConfig
from supervisor.journal import Journal

log = structlog.get_logger("supervisor")


class Recorder:
    def __init__(self, journal: Journal, past: Iterable[dict[str, Any]] = (),
                 ledger_config: LedgerConfig | None = None) -> None:  # fmt: skip
        """``past``: the journal's events so far (folded once, here)."""
        self.journal = journal
        self.state = campaign_state.fold(past, ledger_config)

    def record(self, event: dict[str, Any]) -> None:
        """Journal first, then act: a decision is durable before it is carried out."""
        self.journal.append(event)
        self.state.apply(event)
        log.info(event["type"], **{k: v for k, v in event.items() if k not in ("type", "t", "v", "event")})

    def close(self) -> None:
        self.journal.close()

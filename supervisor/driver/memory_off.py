"""The driver's side of the memory tier turning itself off (``decisions.memory_off``): watch the agents'
reports for a rank its node's store failed, journal it once (``memory_off``, also on stderr), and turn the tier
off for the rest of the campaign (``off()``: the next launches get no memory store, nothing is picked, flushed or
copied). A requeued run reads the event back from the journal (``CampaignState.memory_off``) and starts with the
tier off. An observer of the watch: it runs on every pass."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from supervisor.decisions import events as ev
from supervisor.decisions.memory_off import memory_off
from supervisor.driver.context import Context


class MemoryOff:
    def __init__(self, ctx: Context, channel: Any, off: Callable[[], None], *, enabled: bool) -> None:
        """``off``: turns the tier off in this run's parts; ``enabled``: False when it is off already."""
        self.ctx, self.channel, self.off, self.enabled = ctx, channel, off, enabled

    def observe(self, live: Any = None) -> None:
        if not self.enabled:
            return
        failed = dict(self.channel.table.memory_off)
        why = memory_off(failed)
        if not why:
            return
        self.enabled = False
        self.ctx.record(ev.memory_off(self.ctx.clock(), why, {n: [r for r, _ in pairs] for n, pairs in failed.items()}))
        print(f"supervise: {why}", file=sys.stderr, flush=True)
        self.off()

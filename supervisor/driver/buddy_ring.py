"""The driver's side of the memory tier's copies between nodes: tell each node agent its buddy (the node its new
snapshot shards are copied to, ``decisions.buddy.ring`` over the nodes whose agents receive shards and are not
lost; nodes on different leaf switches next to each other when Slurm's topology says which is where), as a
``wire.KIND_ORDER``; again whenever the ring changes (a node lost: the ring closes over it) and every
few seconds (a datagram may be lost; agents take the same order twice without effect). A new ring is journaled
(``memory_buddies``). An observer of the watch: it runs on every pass."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from supervisor.decisions import buddy
from supervisor.decisions import events as ev
from supervisor.driver.context import Context
from supervisor.driver.guard import SLURM_QUERY
from supervisor.heartbeat.orders import buddy_order

RESEND_S = 5.0


class BuddyRing:
    def __init__(self, ctx: Context, channel: Any, lost: Callable[[], Collection[str]], *, enabled: bool,
                 mono: Callable[[], float] = time.monotonic,
                 switches: Callable[[], Mapping[str, str]] | None = None) -> None:  # fmt: skip
        """``switches``: node -> its leaf switch, from Slurm's topology (asked once; a failed query is journaled
        and the ring is ordered by name, as without a topology)."""
        self.ctx, self.channel, self.lost, self.enabled, self.mono = ctx, channel, lost, enabled, mono
        self.ring: dict[str, str] = {}
        self.sent_at = 0.0
        self.switches = switches
        self.switch_of: Mapping[str, str] | None = None

    def observe(self, live: Any = None) -> None:
        if not self.enabled:
            return
        addresses: dict[str, str] = dict(self.channel.table.replication)
        if not addresses:
            return
        if self.switch_of is None:
            asked = self.ctx.guard.call(SLURM_QUERY, self.switches, default=None) if self.switches else None
            self.switch_of = dict(asked or {})
        gone = set(self.lost())
        ring = buddy.ring([n for n in addresses if n not in gone], self.switch_of)
        now = self.mono()
        if ring == self.ring and now - self.sent_at < RESEND_S:
            return
        if ring != self.ring:
            self.ctx.record(ev.memory_buddies(self.ctx.clock(), ring))
            self.ring = ring
        self.sent_at = now
        for node, to in ring.items():
            self.channel.send_order(node, buddy_order(to, addresses[to]))

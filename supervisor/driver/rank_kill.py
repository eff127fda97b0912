"""Killing ranks alone, through their nodes' agents (``CMD_KILL_RANK``): the step goes on, only those processes end.

Used where a warm restart needs a rank's process gone so that its peers' collectives fail or it can be started
again: a rank waiting on its own error whose group keeps its connections, a rank stuck while every other waits
(the watch, driver/watch.py; the wait for the survivors, driver/warm_restart.py). Journaled as ``kill_ranks``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from supervisor.decisions import events as ev
from supervisor.driver.context import Context
from supervisor.driver.ports import Channel
from supervisor.heartbeat import wire


def kill_ranks(ctx: Context, channel: Channel, views: Sequence[Any], ranks: Iterable[int], reason: str) -> None:
    """Journal ``kill_ranks`` with ``reason`` and have each rank's agent (its node from ``views``) kill it."""
    kill = sorted(set(ranks))
    if not kill:
        return
    ctx.record(ev.action_event(ctx.clock(), "kill_ranks", None, tuple(map(str, kill)), reason, {}))
    nodes = {v.rank: v.node for v in views}
    for node in sorted({nodes[r] for r in kill if r in nodes}):
        channel.send(node, [wire.Command(wire.CMD_KILL_RANK, r) for r in kill if nodes.get(r) == node])

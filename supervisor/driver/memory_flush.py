"""The driver's side of the memory tier's flush: when the job must stop with a checkpoint (preemption, time limit,
``supervise cancel --checkpoint``, an L3 checkpoint-and-stop), the newest complete memory snapshot is copied to the
campaign directory so the requeued job, on other nodes and with empty node memory, loses one step, not the work
since the last filesystem checkpoint.

It runs beside the ranks' own save, not instead of it: ``start`` (as the checkpoint request goes out) asks the
agents what they hold, chooses by the restore's pure pick (``decisions.memory_pick``: complete, verified, one
launch, newer than the newest filesystem checkpoint) and orders each holder to copy its shards into a staging
directory (``heartbeat.orders.flush_order``); the agents copy on a thread of their own, from memory, while the
ranks save. ``finish`` (once the launch ended or the wait ran out) commits the flush when every shard arrived
and the ranks did not commit a checkpoint as new meanwhile (then the flush is only a slower copy of it, and goes);
either way one ``memory_flush`` event says what happened.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.checkpoint import flushed
from supervisor.decisions import events as ev
from supervisor.decisions.memory_pick import Pick
from supervisor.driver.context import Context
from supervisor.driver.memory_resume import FLUSHED, MemoryResume
from supervisor.heartbeat.orders import flush_order

FINISH_MIN_S = 2.0  # after the launch ended, how long the copies still get at least


@dataclass
class Pending:
    chosen: Pick
    staging: Path
    digests: dict[int, str]  # rank -> the digest (its reported prefix) of the shard chosen
    started: float  # monotonic
    started_wall: float


class MemoryFlush:
    def __init__(self, ctx: Context, channel: Any, resume: MemoryResume, campaign: Path, key: bytes | None,
                 *, enabled: bool) -> None:  # fmt: skip
        self.ctx, self.channel, self.resume, self.campaign, self.key = ctx, channel, resume, campaign, key
        self.enabled = enabled

    def start(self, nodes: Sequence[str], tasks_per_node: int, usable: Sequence[str],
              newest_filesystem_step: int | None) -> Pending | None:  # fmt: skip
        """Order the copies of the newest complete snapshot of the launch on ``nodes`` (rank order); None (and
        journaled) when there is nothing newer than the filesystem checkpoint to flush."""
        if not self.enabled or not any(items for _, items in self.channel.table.memory.values()):
            return None  # the program takes no snapshots: nothing to say
        placement = {r: nodes[r // tasks_per_node] for r in range(len(nodes) * tasks_per_node)}
        held = self.resume.holdings(usable)
        chosen, why = self.resume.choose(held, placement, usable, newest_filesystem_step)
        if chosen is None:
            self.ctx.record(ev.memory_flush(self.ctx.clock(), None, f"nothing to flush: {why}"))
            return None
        digests = {rank: h.digest for rank, source in chosen.sources.items() for h in held.get(source, ())
                   if (h.step, h.launch, h.rank) == (chosen.step, chosen.launch, rank)}  # fmt: skip
        if FLUSHED in chosen.sources.values() or len(digests) != len(placement):
            self.ctx.record(ev.memory_flush(self.ctx.clock(), None, "the newest snapshot is already on the filesystem"))
            return None
        staging = flushed.staging(self.campaign, chosen.step)
        by_node: dict[str, list[tuple[int, int, str]]] = {}
        for rank, source in sorted(chosen.sources.items()):
            by_node.setdefault(source, []).append((chosen.step, rank, chosen.launch))
        for node, shards in by_node.items():
            self.channel.send_order(node, flush_order(str(staging), shards))
        return Pending(chosen, staging, digests, time.monotonic(), time.time())

    def finish(self, pending: Pending | None, newest_filesystem_step: int | None, deadline: float) -> Path | None:
        """Wait (until the monotonic ``deadline``, at least ``FINISH_MIN_S``) for every shard, then commit; the
        committed path, or None (journaled why)."""
        if pending is None:
            return None
        step = pending.chosen.step
        if newest_filesystem_step is not None and newest_filesystem_step >= step:
            flushed.discard(pending.staging)
            self.ctx.record(ev.memory_flush(self.ctx.clock(), None, f"the ranks committed step "
                                            f"{newest_filesystem_step} themselves (the snapshot is of step {step})"))
            return None
        end = max(deadline, time.monotonic() + FINISH_MIN_S)
        while True:
            done = flushed.arrived(pending.staging, pending.digests)
            if len(done) == len(pending.digests) or time.monotonic() >= end:
                break
            self.channel.poll(0.1)
        seconds = copy_seconds(pending) if len(done) == len(pending.digests) else time.monotonic() - pending.started
        missing = sorted(set(pending.digests) - set(done))
        if missing:
            flushed.discard(pending.staging)
            self.ctx.record(ev.memory_flush(self.ctx.clock(), None, f"{len(missing)} shard(s) of step {step} did not "
                                            f"reach the filesystem in time (ranks {missing[:8]})", seconds=seconds))
            return None
        path = flushed.commit(pending.staging, step=step, world=len(pending.digests), launch=pending.chosen.launch,
                              digests=done, key=self.key)  # fmt: skip
        self.ctx.record(ev.memory_flush(self.ctx.clock(), step, f"snapshot of step {step} flushed to the filesystem: "
                                        "the requeued job resumes from it", str(path), len(done), seconds,
                                        pending.chosen.launch))  # fmt: skip
        return path


def copy_seconds(pending: Pending) -> float:
    """From the orders to the last shard's record in place (the agents' copies), not the wait around them."""
    try:
        last = max((pending.staging / f"rank_{r}.json").stat().st_mtime for r in pending.digests)
    except (OSError, ValueError):
        return time.monotonic() - pending.started
    return max(0.0, last - pending.started_wall)

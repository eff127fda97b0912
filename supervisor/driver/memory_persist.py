"""The driver's side of persisting memory snapshots while the training runs (``decisions.memory_persist`` says
when and why): at each pass of the watch, start a persist when one is due, or see whether the one under way is
complete and commit it.

A persist orders every node running ranks of the current launch to copy its ranks' first snapshot after the
newest step reported (``heartbeat.orders.flush_order`` with ``background``; the agents choose the step
together, ``agent.flush_copy.pin_next``) into one staging directory of the campaign's ``memory-flush/``, and
commits it (``checkpoint.flushed``, the stop's flush format: manifest with every rank's SHA-256, MAC'ed with
the campaign key, renamed into place; the older flush goes) once every rank's shard arrived, all of one step
and of this launch. The relaunch's pick (``driver.memory_resume``) already reads that directory: a requeue whose
own flush failed, or a node lost with its buddy, resumes from it rather than from the program's older
filesystem checkpoint. Nothing here waits: the watch goes on between passes. A stop's flush (``actuators``)
first drops a persist under way (both write in ``memory-flush/``; the stop's copy is the one that matters).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.agent.flush_copy import PERSIST_WAIT_S
from supervisor.checkpoint import flushed
from supervisor.decisions import events as ev
from supervisor.decisions import memory_persist as rule
from supervisor.decisions import memory_pick
from supervisor.driver.context import Context
from supervisor.driver.guard import CHECKPOINT_SCAN
from supervisor.driver.memory_resume import MemoryResume
from supervisor.heartbeat.orders import flush_order

COPY_ALLOWANCE_S = 60.0  # after the agents' wait for the snapshot, the copies' time at least (twice the last's)


@dataclass
class Persisting:
    staging: Path
    launch: str
    world: int
    floor: int  # the step the agents take the first snapshot at or after
    started: float  # monotonic
    started_wall: float


class MemoryPersist:
    def __init__(self, ctx: Context, channel: Any, resume: MemoryResume, campaign: Path, key: bytes | None, *,
                 setting: str | float, newest_filesystem_step: Callable[[], int | None],
                 launch_tag: Callable[[], str], enabled: bool, mono: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:  # fmt: skip
        """``newest_filesystem_step``: the program's newest committed checkpoint; ``launch_tag``: the current
        launch's name for its ranks (``SUPERVISOR_LAUNCH``), which its snapshots carry."""
        self.ctx, self.channel, self.resume, self.campaign, self.key = ctx, channel, resume, campaign, key
        self.setting, self.newest_filesystem_step, self.launch_tag = setting, newest_filesystem_step, launch_tag
        self.enabled, self.mono, self.wall = enabled, mono, wall
        self.pending: Persisting | None = None
        self.last_started: float | None = None
        self.last_copy_s: float | None = None
        self.persisted: tuple[int, str] | None = None  # (step, launch) of the newest persist committed in this run
        self.failing = False  # a failure was journaled; the next is not, until one succeeds
        self.again = False  # the nodes took different steps: try again at once, not after the interval
        self.retried = False  # ... which this persist was: a second miss waits for the interval (the copies load
        #                       the filesystem each time)

    def observe(self, live: Any = None) -> None:
        """One pass of the watch: commit or give up the persist under way, else start one when due. A failure
        here (the campaign directory unwritable, a full disk) is journaled and skips this pass only: it must not
        cost the watch's detectors, which run after the observers."""
        if not self.enabled or self.setting == rule.OFF:
            return
        self.ctx.guard.call(CHECKPOINT_SCAN, self._observe, live, default=None)

    def _observe(self, live: Any) -> None:
        now = self.mono()
        tag = self.launch_tag()
        if self.pending is not None and self.pending.launch != tag:
            self.cancel()  # its launch is over (a node of it may be gone): the new launch's snapshots matter now
        if self.pending is not None:
            self._check(self.pending, now)
            return
        held = [h for _, items in self.channel.table.memory.values() for h in items if h.launch == tag]
        if not held or live is None:
            return
        world = held[0].world
        placement = {r.rank: r.node for r in live.ranks}
        if set(placement) != set(range(world)):  # not every rank seen yet (or another world): not now
            return
        newest = max(h.step for h in held)
        if self.last_started is None:  # the interval counts from the first snapshot seen (a persist of the
            self.last_started = now  # resumed-from state would only copy what the filesystem already has)
            return
        since = None if self.again else now - self.last_started
        if not rule.due(rule.every_s(self.setting, self.last_copy_s), since, newest, self._persisted_step(tag)):
            return
        # The next snapshot, not the newest seen: the ranks keep their two newest, so a step already written may
        # be gone on a node whose order comes late, and that node would take a later one than the others.
        floor = newest + 1
        staging = flushed.staging(self.campaign, floor)
        by_node: dict[str, list[tuple[int, int, str]]] = {}
        for rank, node in sorted(placement.items()):
            by_node.setdefault(node, []).append((floor, rank, tag))
        for node, shards in by_node.items():
            self.channel.send_order(node, flush_order(str(staging), shards, background=True))
        self.pending = Persisting(staging, tag, world, floor, now, self.wall())
        self.last_started, self.retried, self.again = now, self.again, False

    def cancel(self) -> None:
        """Drop the persist under way (a stop's flush is about to write in the same place)."""
        if self.pending is not None:
            flushed.discard(self.pending.staging)
            self.pending = None

    def _persisted_step(self, tag: str) -> int | None:
        """The newest step already on the filesystem: the program's checkpoint, or a flush of a launch that did
        not diverge before it (a roll back's new timeline must be persisted again from its lower steps)."""
        steps = [self.newest_filesystem_step()]
        if self.persisted is not None:
            steps.append(self.persisted[0])
        found = self.resume.flushed
        if found is not None and memory_pick.without_diverged(found.held, self.resume.diverged):
            steps.append(found.step)
        known = [s for s in steps if s is not None]
        return max(known) if known else None

    def _check(self, p: Persisting, now: float) -> None:
        got = flushed.arrived_any(p.staging, range(p.world))
        if len(got) == p.world:
            self.pending = None
            steps = {step for step, _, _ in got.values()}
            if len(steps) != 1 or any(launch != p.launch for _, launch, _ in got.values()):
                # An agent looked only after its ranks had replaced the step twice (snapshots every few ms on
                # a busy node): nothing is wrong with the snapshots, so the next persist starts at once.
                flushed.discard(p.staging)
                self.again = not self.retried
                self._failed(f"the nodes copied snapshots of different steps ({sorted(steps)[:4]})")
                return
            step = steps.pop()
            path = flushed.commit(p.staging, step=step, world=p.world, launch=p.launch,
                                  digests={r: d for r, (_, _, d) in got.items()}, key=self.key)  # fmt: skip
            self.last_copy_s = _copy_seconds(p, got)
            self.persisted, self.failing, self.retried = (step, p.launch), False, False
            self.ctx.record(ev.memory_persist(self.ctx.clock(), step, f"snapshot of step {step} persisted while the "
                                              "training ran", str(path), p.world, self.last_copy_s))  # fmt: skip
            return
        if now - p.started > PERSIST_WAIT_S + max(COPY_ALLOWANCE_S, 2 * (self.last_copy_s or 0.0)):
            self.pending = None
            flushed.discard(p.staging)
            missing = sorted(set(range(p.world)) - set(got))
            self._failed(f"{len(missing)} rank shard(s) of a snapshot at or after step {p.floor} did not reach the "
                         f"filesystem within {now - p.started:.0f} s (ranks {missing[:8]})")

    def _failed(self, why: str) -> None:
        if not self.failing:
            self.ctx.record(ev.memory_persist(self.ctx.clock(), None, f"{why}; persisting again at the next interval"))
        self.failing = True


def _copy_seconds(p: Persisting, got: dict[int, tuple[int, str, str]]) -> float:
    """From the orders to the last shard's record in place (the agents' copies), not the passes around them."""
    try:
        last = max((p.staging.parent / f"step_{step}" / f"rank_{r}.json").stat().st_mtime
                   for r, (step, _, _) in got.items())  # fmt: skip
    except (OSError, ValueError):
        return 0.0
    return max(0.0, last - p.started_wall)

"""The driver's side of the memory tier's restore: before a relaunch, ask every node agent for its memory store's
inventory (``wire.CMD_REPORT_MEMORY``), wait briefly for the answers, and let the pure pick
(``decisions.memory_pick``) choose the snapshot; the choice, or why there is none, is journaled (``memory_pick``).

The first launch of a Slurm run has nothing in memory (the store lives in this run's slot directories) and is not
asked about; nor is a relaunch when no agent has reported a single snapshot in this run (the program takes none:
no wait). A launch that met a NaN/Inf loss is remembered with its last finite step: its later snapshots may
hold the diverged weights and are never picked. A pick whose shards are not all on the nodes their ranks will run
on (a rank moved to a spare, its node lost) has them copied there first: the node holding each (the buddy) is
ordered to send it (``heartbeat.orders.fetch_order``), the supervisor waits until the new nodes report them
verified, and picks again; copies that do not arrive in time mean the filesystem tier, journaled.

A snapshot the previous Slurm run flushed to the campaign directory before it stopped (``checkpoint.flushed``,
``driver.memory_flush``) is one more holder, ``FLUSHED``, that every rank reads directly: the first launch of a
requeued job resumes from it when it is newer than the newest filesystem checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from supervisor.checkpoint.flushed import Flushed
from supervisor.decisions import events as ev
from supervisor.decisions import memory_pick
from supervisor.driver.context import Context
from supervisor.heartbeat import wire
from supervisor.heartbeat.orders import fetch_order

REPORT_WAIT_S = 2.0  # the agents scan their stores every 0.5 s
SILENT_S = 3.0  # an agent's summaries (every second) this old: its node may be gone (detect.node_stale_s)
FETCH_WAIT_S = 15.0  # copies of the shards to the ranks' new nodes (a node's share of the state at >= 1 GB/s)
FLUSHED = "(flushed)"  # the holder name of the snapshot flushed to the filesystem (no node is named so)


class MemoryResume:
    def __init__(self, ctx: Context, channel: Any, *, enabled: bool, wait_s: float = REPORT_WAIT_S,
                 fetch_wait_s: float = FETCH_WAIT_S, wall: Callable[[], float] = time.time,
                 flushed: Callable[[], tuple[Flushed | None, str]] | None = None) -> None:  # fmt: skip
        """``channel``: the supervisor's side of the agents' channel (``send``, ``send_order``, ``poll``,
        ``table.memory``, ``table.replication``); ``flushed``: the newest flushed snapshot that checks out
        (``checkpoint.flushed.newest``), None when there is no place for one."""
        self.ctx, self.channel, self.enabled, self.wait_s, self.wall = ctx, channel, enabled, wait_s, wall
        self.fetch_wait_s = fetch_wait_s
        self.flushed_source = flushed
        self.flushed: Flushed | None = None  # the flushed snapshot as read at the last pick
        self.diverged: dict[str, int] = {}  # launch tag -> its last step with a finite loss

    def diverged_after(self, launch_tag: str, last_finite_step: int | None) -> None:
        """A launch met a NaN/Inf loss: none of its snapshots after ``last_finite_step`` is picked."""
        self.diverged[launch_tag] = last_finite_step if last_finite_step is not None else -1

    def pick(self, launch: int, nodes: Sequence[str], tasks_per_node: int, usable: Sequence[str],
             newest_filesystem_step: int | None, again: bool = False,
             placement: Mapping[int, str] | None = None) -> memory_pick.Pick | None:  # fmt: skip
        """The snapshot launch number ``launch`` (on ``nodes``, in rank order) resumes from, or None; ``again``:
        launch ``launch`` itself restarts in its processes (a warm restart: its snapshots are in memory);
        ``placement``: rank -> node when it is not srun's block layout (a warm torchrun launch's ranks stay where
        its rendezvous put them)."""
        if not self.enabled:
            return None
        self.flushed = self._read_flushed()
        reported = any(items for _, items in self.channel.table.memory.values())
        if launch <= 1 and not again and self.flushed is None:
            return None
        if not reported and self.flushed is None:
            self.ctx.record(ev.memory_pick(self.ctx.clock(), launch, None, "no node reported a memory snapshot in this "
                                           "Slurm run (the program takes none: CheckpointSaver.snapshot)"))  # fmt: skip
            return None
        if placement is None:
            placement = {r: nodes[r // tasks_per_node] for r in range(len(nodes) * tasks_per_node)}
        held = dict(self.holdings(usable)) if (launch > 1 or again) and reported else {}
        chosen, why = self.choose(held, placement, usable, newest_filesystem_step)
        if chosen is not None and chosen.fetches:
            chosen, why = self._fetch(chosen, placement, usable, newest_filesystem_step)
        self.ctx.record(ev.memory_pick(self.ctx.clock(), launch, chosen.step if chosen else None, why,
                                       chosen.fetches if chosen else 0, chosen.launch if chosen else ""))  # fmt: skip
        return chosen

    def flushed_dir(self, chosen: memory_pick.Pick | None) -> str:
        """The flushed snapshot's directory when ``chosen`` reads a shard from it (the ranks' env), else ""."""
        f = self.flushed
        if chosen is None or f is None or FLUSHED not in chosen.sources.values():
            return ""
        return str(f.path) if (f.step, f.launch) == (chosen.step, chosen.launch) else ""

    def _read_flushed(self) -> Flushed | None:
        if self.flushed_source is None:
            return None
        found, _ = self.flushed_source()
        return found

    def choose(self, held: Mapping[str, tuple[memory_pick.Held, ...]], placement: Mapping[int, str],
               usable: Sequence[str], newest_filesystem_step: int | None) -> tuple[memory_pick.Pick | None, str]:  # fmt: skip
        """The pure pick over ``held`` (node -> its shards), the flushed snapshot and the diverged launches."""
        every = {n: memory_pick.without_diverged(h, self.diverged) for n, h in held.items()}
        serving = list(usable)
        if self.flushed is not None:
            every[FLUSHED] = memory_pick.without_diverged(self.flushed.held, self.diverged)
            serving.append(FLUSHED)
        return memory_pick.pick(every, world=len(placement), usable=serving, placement=placement,
                                newest_filesystem_step=newest_filesystem_step, shared=frozenset({FLUSHED}))  # fmt: skip

    def _fetch(self, chosen: memory_pick.Pick, placement: Mapping[int, str], usable: Sequence[str],
               newest_filesystem_step: int | None) -> tuple[memory_pick.Pick | None, str]:  # fmt: skip
        """Order each shard not on its rank's node copied there by the node that holds it, wait for the copies
        to be reported, and pick again: the snapshot when every shard is home now, else the filesystem tier."""
        addresses: dict[str, str] = dict(self.channel.table.replication)
        orders: dict[str, list[tuple[str, str, int, int]]] = {}
        for rank, source in sorted(chosen.sources.items()):
            home = placement[rank]
            if home == source or source == FLUSHED:
                continue
            if home not in addresses:
                return None, f"{chosen.why}; node {home} (rank {rank}'s) cannot receive shards: the filesystem tier"
            orders.setdefault(source, []).append((home, addresses[home], chosen.step, rank))
        for source, items in orders.items():
            self.channel.send_order(source, fetch_order(items))
        wanted = {(placement[r], r) for items in orders.values() for _, _, _, r in items}
        deadline = time.monotonic() + self.fetch_wait_s
        while True:
            table: dict[str, tuple[float, tuple[memory_pick.Held, ...]]] = self.channel.table.memory
            arrived = {(n, h.rank) for n, (_, items) in table.items() for h in items
                       if h.step == chosen.step and h.launch == chosen.launch and h.verified}  # fmt: skip
            if wanted <= arrived or time.monotonic() >= deadline:
                break
            self.channel.poll(0.05)
        again, why = self.choose({n: items for n, (_, items) in table.items()}, placement, usable,
                                 newest_filesystem_step)  # fmt: skip
        if again is not None and again.fetches == 0:  # journaled with the copies made for it
            why = (f"snapshot of step {again.step} complete in memory: {chosen.fetches} shard(s) copied from a buddy "
                   "before the launch")  # fmt: skip
            return replace(again, fetches=chosen.fetches, why=why), why
        return None, (f"{chosen.why}; the copies to the ranks' nodes did not arrive within {self.fetch_wait_s:.0f} s: "
                      "the filesystem tier")  # fmt: skip

    def holdings(self, nodes: Sequence[str]) -> Mapping[str, tuple[memory_pick.Held, ...]]:
        """Every node's inventory, asked for now. A node that does not answer within ``wait_s`` counts with its
        last report while its agent's heartbeats are fresh (a busy agent; a restore checks every shard again before
        using it), and with none once they stopped too: a node lost at the same moment (a rack, a switch) whose
        loss is not yet confirmed must not be picked to serve, or to run, a shard it no longer has."""
        asked = self.wall()
        for node in nodes:
            self.channel.send(node, [wire.Command(wire.CMD_REPORT_MEMORY)])
        deadline = time.monotonic() + self.wait_s
        while True:
            table: dict[str, tuple[float, tuple[memory_pick.Held, ...]]] = self.channel.table.memory
            if all(n in table and table[n][0] >= asked for n in nodes) or time.monotonic() >= deadline:
                silent = {n for n, v in self.channel.table.node_views(nodes).items() if v.staleness_s > SILENT_S}
                return {n: table[n][1] for n in nodes if n in table and (table[n][0] >= asked or n not in silent)}
            self.channel.poll(0.05)

"""The driver's side of the memory tier's restore: before a relaunch, ask every node agent for its memory store's
inventory (``wire.CMD_REPORT_MEMORY``), wait briefly for the answers, and let the pure pick
(``decisions.memory_pick``) choose the snapshot; the choice, or why there is none, is journaled (``memory_pick``).

The first launch of a Slurm run has nothing in memory (the store lives in this run's slot directories) and is not
asked about; nor is a relaunch when no agent has reported a single snapshot in this run (the program takes none:
no wait). A launch that met a NaN/Inf loss is remembered with its last finite step: its later snapshots may
hold the diverged weights and are never picked. A pick whose shards are not all on the nodes their ranks will run
on needs a copy from a buddy node first; until that copy exists (issue 27) such a relaunch uses the filesystem
tier and says so.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from supervisor.decisions import events as ev
from supervisor.decisions import memory_pick
from supervisor.driver.context import Context
from supervisor.heartbeat import wire

REPORT_WAIT_S = 2.0  # the agents scan their stores every 0.5 s


class MemoryResume:
    def __init__(self, ctx: Context, channel: Any, *, enabled: bool, wait_s: float = REPORT_WAIT_S,
                 wall: Callable[[], float] = time.time) -> None:  # fmt: skip
        """``channel``: the supervisor's side of the agents' channel (``send``, ``poll``, ``table.memory``)."""
        self.ctx, self.channel, self.enabled, self.wait_s, self.wall = ctx, channel, enabled, wait_s, wall
        self.diverged: dict[str, int] = {}  # launch tag -> its last step with a finite loss

    def diverged_after(self, launch_tag: str, last_finite_step: int | None) -> None:
        """A launch met a NaN/Inf loss: none of its snapshots after ``last_finite_step`` is picked."""
        self.diverged[launch_tag] = last_finite_step if last_finite_step is not None else -1

    def pick(self, launch: int, nodes: Sequence[str], tasks_per_node: int, usable: Sequence[str],
             newest_filesystem_step: int | None) -> memory_pick.Pick | None:  # fmt: skip
        """The snapshot launch number ``launch`` (on ``nodes``, in rank order) resumes from, or None."""
        if not self.enabled or launch <= 1:
            return None
        if not any(items for _, items in self.channel.table.memory.values()):
            self.ctx.record(ev.memory_pick(self.ctx.clock(), launch, None, "no node reported a memory snapshot in this "
                                           "Slurm run (the program takes none: CheckpointSaver.snapshot)"))  # fmt: skip
            return None
        held = self._fresh_holdings(usable)
        placement = {r: nodes[r // tasks_per_node] for r in range(len(nodes) * tasks_per_node)}
        chosen, why = memory_pick.pick({n: memory_pick.without_diverged(h, self.diverged) for n, h in held.items()},
                                       world=len(placement), usable=usable, placement=placement,
                                       newest_filesystem_step=newest_filesystem_step)  # fmt: skip
        if chosen is not None and chosen.fetches:
            why = (f"{why}; copying shards between nodes before a launch is not built yet: the filesystem tier "
                   "is used")  # fmt: skip
            chosen = None
        self.ctx.record(ev.memory_pick(self.ctx.clock(), launch, chosen.step if chosen else None, why,
                                       chosen.fetches if chosen else 0, chosen.launch if chosen else ""))  # fmt: skip
        return chosen

    def _fresh_holdings(self, nodes: Sequence[str]) -> Mapping[str, tuple[memory_pick.Held, ...]]:
        """Every node's inventory, asked for now; a node that does not answer within ``wait_s`` counts with its
        last report (a restore checks every shard again before using it) or none."""
        asked = self.wall()
        for node in nodes:
            self.channel.send(node, [wire.Command(wire.CMD_REPORT_MEMORY)])
        deadline = time.monotonic() + self.wait_s
        while True:
            table: dict[str, tuple[float, tuple[memory_pick.Held, ...]]] = self.channel.table.memory
            if all(n in table and table[n][0] >= asked for n in nodes) or time.monotonic() >= deadline:
                return {n: table[n][1] for n in nodes if n in table}
            self.channel.poll(0.05)

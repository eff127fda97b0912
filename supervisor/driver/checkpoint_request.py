"""Asking the ranks of a launch to checkpoint (and stop), until every one of them has the request.

WHY not one broadcast: Slurm's USR1 (time limit, preemption) can arrive right after a launch, before the ranks
have created their slots; a flag written then reaches nobody (a rank ignores requests older than itself), the
ranks train on, are killed after the grace and nothing is saved. So the request is sent to each rank by name
once the heartbeat table shows it (its slot exists, so it will see the request), and sent again to a rank whose
reported control flags do not show it after ``RESEND_S`` (a lost datagram). The caller waits for the launch to
end, then checks that a new checkpoint committed; a request that missed is journaled (``checkpoint_missed``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from supervisor import procstate
from supervisor.heartbeat import wire

RESEND_S = 2.0  # a rank whose control flags do not show the request this long after a send gets it again
MAX_SENDS = 5  # per rank process


class CheckpointRequest:
    """Delivers ``flags`` to every rank process that appears while the request stands."""

    def __init__(self, channel: Any, ranks: Callable[[], Sequence[Any]], flags: int) -> None:
        self.channel, self.ranks, self.flags = channel, ranks, flags
        self.sent: dict[int, tuple[float, int]] = {}  # rank pid -> (last sent, sends)
        self.acked: set[int] = set()  # pids whose control flags show the request
        self.seen: dict[int, int] = {}  # pid -> rank number

    def deliver(self) -> None:
        """One round: send to new rank processes, resend to those that have not shown it, note the acks."""
        now = time.monotonic()
        by_node: dict[str, list[wire.Command]] = {}
        for r in self.ranks():
            if r.state in procstate.ENDED:
                continue
            self.seen[r.pid] = r.rank
            if (r.control_flags & self.flags) == self.flags and r.pid in self.sent:
                self.acked.add(r.pid)
                continue
            last = self.sent.get(r.pid)
            if last is not None and (now - last[0] < RESEND_S or last[1] >= MAX_SENDS):
                continue
            self.sent[r.pid] = (now, (last[1] if last else 0) + 1)
            by_node.setdefault(r.node, []).append(
                wire.Command(wire.CMD_SET_FLAGS, r.rank, wire.flags_arg(self.flags, 0)))
        for node, cmds in by_node.items():
            self.channel.send(node, cmds)

    def unreached(self) -> list[int]:
        """Ranks seen while the request stood whose flags never showed it (not started, no client, lost)."""
        return sorted({rank for pid, rank in self.seen.items() if pid not in self.acked})

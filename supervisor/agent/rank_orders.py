"""What the supervisor orders a node agent to do to its ranks for a warm restart: write the restart order for the
ranks waiting in their processes, write a standby rank's assignment, kill one hung rank.

WHY apart from the agent's loop: these act on the ranks' processes and their private slot directory, not on the
heartbeat path or the memory tier; the agent only hands them the authenticated order. Every failure is counted
and said on stderr, never raised (a bad order must not stop the agent watching the other ranks).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from collections import Counter
from pathlib import Path

from supervisor.agent.sampler import RankSlots
from supervisor.agent.stacks import send_checked
from supervisor.client.restart_order import ASSIGN_ENV, write_order
from supervisor.client.standby import assign_name
from supervisor.heartbeat.orders import Orders


def write_rank_orders(slot_dir: Path, orders: Orders, counters: Counter[str]) -> Orders:
    """Write the restart order and a standby's assignment in ``orders`` into ``slot_dir``; returns the rest of
    ``orders`` (the memory tier's part)."""
    if orders.restart is not None:  # the ranks restarting in their processes read it: no memory tier needed
        try:
            write_order(slot_dir, orders.restart)
            counters["restart_orders"] += 1
        except OSError as err:
            counters["restart_order_errors"] += 1
            print(f"supervisor agent: cannot write the restart order into {slot_dir}: {err}", file=sys.stderr,
                  flush=True)  # fmt: skip
    if orders.assign is not None:  # a standby on this node takes over a rank
        standby, assignment = orders.assign
        try:
            write_order(slot_dir, assignment, name=assign_name(standby), allowed=ASSIGN_ENV)
            counters["standby_assignments"] += 1
        except OSError as err:
            counters["standby_assignment_errors"] += 1
            print(f"supervisor agent: cannot write standby {standby}'s assignment: {err}", file=sys.stderr,
                  flush=True)  # fmt: skip
    return dataclasses.replace(orders, restart=None, assign=None)


def kill_rank(slots: RankSlots, rank: int, counters: Counter[str]) -> None:
    """SIGKILL one rank (a hung one, so that its peers' collectives fail and they restart warm), checked to be the
    process the rank is (a recycled pid is never signalled); a stopped process dies of SIGKILL too."""
    rec = slots.records.get(rank)
    pid = rec.pid if rec is not None else slots.slotless.get(rank)
    started_by = rec.start_wall_ns / 1e9 if rec is not None and rec.start_wall_ns > 0 else \
        slots.slotless_since.get(rank)  # fmt: skip
    if not pid or pid <= 0:
        counters["kill_rank_unknown"] += 1
        return
    why = send_checked(pid, signal.SIGKILL, started_by)
    counters["kill_rank_failed" if why else "kill_rank"] += 1
    if why:
        print(f"supervisor agent: rank {rank} not killed: {why}", file=sys.stderr, flush=True)

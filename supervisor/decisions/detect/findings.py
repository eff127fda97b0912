"""What the detectors see and what they say.

A rank is the live table's own ``RankView`` (``supervisor.heartbeat.table``: one type, one set of field names
from the table to the detectors); a detector snapshot groups those views by node with each node's staleness,
so the detectors stay pure and can be driven by hand-written snapshots in tests and simulations.  Process
states are the names of ``supervisor.procstate``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from supervisor import procstate
from supervisor.heartbeat.table import RankView as RankView  # re-exported: detectors name it from here

if TYPE_CHECKING:
    from supervisor.heartbeat import table

# Detection kinds. "fault" kinds interrupt the run (the loop classifies and acts); "warning" kinds are alerts.
RANK_HANG = "rank_hang"  # some ranks silent longer than their phase's timeout
RANK_STOPPED = "rank_stopped"  # a rank process is in stopped state (SIGSTOP, debugger): it cannot progress
GLOBAL_STALL = "global_stall"  # every rank silent and no laggard stands out
NODE_SILENT = "node_silent"  # no summaries from a node agent: the node (or its agent) is gone
NODE_LOST = "node_lost"  # the supervisor's own verdict (decisions/nodeloss.py): silent and confirmed dead
RANK_EXITED = "rank_exited"  # a rank process exited or is a zombie while the step should be running
NONFINITE_LOSS = "nonfinite_loss"  # NaN/Inf loss
STRAGGLER = "straggler"  # persistent slowdown vs peers (warning)
LOSS_SPIKE = "loss_spike"  # sliding-window z-score spike (warning)
LOSS_DIVERGED = "loss_diverged"  # a spike the loss did not come back from (a fault: rolled back like a NaN)

FAULT_KINDS = frozenset({RANK_HANG, RANK_STOPPED, GLOBAL_STALL, NODE_SILENT, NODE_LOST, RANK_EXITED, NONFINITE_LOSS,
                         LOSS_DIVERGED})  # fmt: skip
WARNING_KINDS = frozenset({STRAGGLER, LOSS_SPIKE})
HANG_KINDS = frozenset({RANK_HANG, RANK_STOPPED, GLOBAL_STALL})


proc_meaning = procstate.meaning  # 'stopped', 'gone' or 'alive' (unknown states count as alive)


@dataclass(frozen=True)
class NodeRanks:
    node: str
    staleness_s: float  # time since the node agent's last summary
    ranks: tuple[RankView, ...] = ()


@dataclass(frozen=True)
class LaunchView:
    """The live table at one instant (``launch_age_s``: time since the current training step was launched)."""

    nodes: tuple[NodeRanks, ...]
    launch_age_s: float = 0.0

    def ranks(self) -> Iterator[RankView]:
        for node in self.nodes:
            yield from node.ranks


@dataclass(frozen=True)
class DetectionEvent:
    """A detector's finding with the evidence a human needs to trust it."""

    kind: str
    ranks: tuple[int, ...] = ()
    nodes: tuple[str, ...] = ()
    metric: str = ""
    value: float | None = None
    threshold: float | None = None
    duration_s: float | None = None
    evidence: tuple[str, ...] = field(default=())

    @property
    def is_fault(self) -> bool:
        return self.kind in FAULT_KINDS

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["ranks"] = list(self.ranks)
        data["nodes"] = list(self.nodes)
        data["evidence"] = list(self.evidence)
        return data


def of_rank(kind: str, view: RankView, metric: str, value: float | None, *evidence: str,
            threshold: float | None = None, duration_s: float | None = None) -> DetectionEvent:  # fmt: skip
    """A finding about one rank (its rank and node named from its view)."""
    return DetectionEvent(kind, (view.rank,), (view.node,), metric, value, threshold, duration_s, evidence)


def of_silence(kind: str, ranks: Iterable[int], nodes: Iterable[str], metric: str, silent_s: float, threshold: float,
               *evidence: str) -> DetectionEvent:  # fmt: skip
    """A finding about a silence: its measure is its duration (ranks sorted, nodes sorted and unique)."""
    return DetectionEvent(kind, tuple(sorted(ranks)), sorted_nodes(list(nodes)), metric, silent_s, threshold, silent_s,
                          evidence)  # fmt: skip


def sorted_nodes(nodes: Sequence[str] | set[str]) -> tuple[str, ...]:
    return tuple(sorted(set(nodes)))


def snapshot_from_live(live: table.Snapshot, launch_age_s: float = 0.0) -> LaunchView:
    """Group a live-table snapshot's rank views by node, each node with its staleness (a node that lost all
    its ranks still counts: its silence is evidence)."""
    by_node: dict[str, list[RankView]] = {name: [] for name in live.nodes}
    for r in live.ranks:
        by_node.setdefault(r.node, []).append(r)
    nodes = tuple(
        NodeRanks(name, live.nodes[name].staleness_s if name in live.nodes else float("inf"), tuple(views))
        for name, views in sorted(by_node.items())
    )
    return LaunchView(nodes=nodes, launch_age_s=launch_age_s)

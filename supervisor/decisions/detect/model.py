"""What the detectors see and what they say.

The aggregator's live table is adapted into these small immutable views (one per rank and per node) so the
detectors stay pure and can be driven by hand-written snapshots in tests and simulations.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

# Process states as psutil or /proc report them, folded into three meanings.
_STOPPED = frozenset({"T", "t", "stopped", "tracing-stop"})
_GONE = frozenset({"Z", "X", "x", "zombie", "dead", "exited", "gone"})

# Detection kinds. "fault" kinds interrupt the run (the loop classifies and acts); "warning" kinds are alerts.
RANK_HANG = "rank_hang"  # some ranks silent longer than their phase's timeout
RANK_STOPPED = "rank_stopped"  # a rank process is in stopped state (SIGSTOP, debugger): it cannot progress
GLOBAL_STALL = "global_stall"  # every rank silent and no laggard stands out
NODE_SILENT = "node_silent"  # no summaries from a node agent: the node (or its agent) is gone
RANK_EXITED = "rank_exited"  # a rank process exited or is a zombie while the step should be running
NONFINITE_LOSS = "nonfinite_loss"  # NaN/Inf loss
STRAGGLER = "straggler"  # persistent slowdown vs peers (warning)
LOSS_SPIKE = "loss_spike"  # sliding-window z-score spike (warning)

FAULT_KINDS = frozenset({RANK_HANG, RANK_STOPPED, GLOBAL_STALL, NODE_SILENT, RANK_EXITED, NONFINITE_LOSS})
WARNING_KINDS = frozenset({STRAGGLER, LOSS_SPIKE})
HANG_KINDS = frozenset({RANK_HANG, RANK_STOPPED, GLOBAL_STALL})


def proc_meaning(state: str | None) -> str:
    """'stopped', 'gone' or 'alive' (unknown states count as alive: only positive evidence raises alarms)."""
    if state in _STOPPED:
        return "stopped"
    if state in _GONE:
        return "gone"
    return "alive"


@dataclass(frozen=True)
class RankView:
    """One rank as the supervisor last saw it. Ages are seconds, measured by the aggregator."""

    rank: int
    node: str
    pid: int | None = None
    step: int | None = None  # None: the rank has not reported a step yet
    phase: str | None = None  # "init", "step", "checkpoint", "eval", ... None: never beat (no client)
    beat_age_s: float | None = None  # None: the rank never beat (it does not use the client)
    iter_ewma_s: float | None = None
    iter_min_s: float | None = None
    iter_max_s: float | None = None
    loss: float | None = None
    proc_state: str | None = None  # psutil status or /proc state letter
    exit_code: int | None = None  # when the agent saw the process end (negative: killed by that signal)


@dataclass(frozen=True)
class NodeView:
    node: str
    summary_age_s: float  # time since the node agent's last summary
    ranks: tuple[RankView, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """The live table at one instant (``launch_age_s``: time since the current training step was launched)."""

    nodes: tuple[NodeView, ...]
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

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DetectionEvent:
        """Rebuild from a journal line (unknown fields ignored)."""
        return cls(
            kind=str(data["kind"]),
            ranks=tuple(int(r) for r in data.get("ranks", ())),
            nodes=tuple(str(n) for n in data.get("nodes", ())),
            metric=str(data.get("metric", "")),
            value=_opt_float(data.get("value")),
            threshold=_opt_float(data.get("threshold")),
            duration_s=_opt_float(data.get("duration_s")),
            evidence=tuple(str(e) for e in data.get("evidence", ())),
        )


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)  # float('nan') parses the journal's "nan" strings too


def sorted_nodes(nodes: Sequence[str] | set[str]) -> tuple[str, ...]:
    return tuple(sorted(set(nodes)))


def snapshot_from_live(live: Any, launch_age_s: float = 0.0) -> Snapshot:
    """Adapt an aggregator snapshot (``supervisor.heartbeat.table.Snapshot``: ``.nodes`` name -> view with
    ``staleness_s``, ``.ranks`` views with ``beat_age_s``, ``ewma_s``...) without importing the aggregator.

    A rank view's ``loss_step < 0`` means "no loss given" (the slot stores NaN then); without that field a
    NaN loss cannot be told from "never given" and is reported as non-finite."""
    by_node: dict[str, list[RankView]] = {name: [] for name in live.nodes}
    for r in live.ranks:
        signal = getattr(r, "exit_signal", None)
        code = -int(signal) if signal else getattr(r, "exit_code", None)
        ewma = getattr(r, "ewma_s", None)
        loss = getattr(r, "loss", None)
        if getattr(r, "loss_step", 0) < 0:  # the slot's "no loss ever given" (its loss field is then NaN)
            loss = None
        by_node.setdefault(r.node, []).append(
            RankView(
                rank=r.rank,
                node=r.node,
                pid=r.pid,
                step=r.step,
                phase=r.phase,
                beat_age_s=r.beat_age_s,
                iter_ewma_s=ewma if ewma is not None and ewma > 0 else None,
                iter_min_s=getattr(r, "min_s", None) or None,
                iter_max_s=getattr(r, "max_s", None) or None,
                loss=loss,
                proc_state=r.state,
                exit_code=code,
            )
        )
    nodes = tuple(
        NodeView(name, live.nodes[name].staleness_s if name in live.nodes else float("inf"), tuple(views))
        for name, views in sorted(by_node.items())
    )
    return Snapshot(nodes=nodes, launch_age_s=launch_age_s)

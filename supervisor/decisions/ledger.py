"""Suspect-node ledger: strikes that fade, folded from the journal. Pure.

A node's score is the sum of its strikes, each halving every ``half_life_s``:
``score(now) = sum(w_i * 2 ** (-(now - t_i) / half_life_s))``. Stored per node as (score at t, t), so memory
is O(nodes) and an update is O(1). A node whose score is at or above ``threshold`` is excluded when the job is
requeued. With the defaults a node failure (weight 2) keeps a node out for one half-life (6 h), while one hang
(weight 0.5) does not exclude it; three hangs in a short time do. Strikes of the ``sticky`` classes (default:
``hardware``: an Xid 79, an uncorrectable ECC error, a GPU that fails its health check) never fade: time does
not repair a GPU, so the node stays out until an operator forgives it (journal event ``node_forgiven``, after a
repair), which clears its score.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from supervisor.decisions import events as ev

DEFAULT_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {
        ev.NODE_FAILURE: 2.0,
        ev.HARDWARE: 2.0,
        ev.HANG: 0.5,
        ev.COMM_ERROR: 0.5,
        ev.APP_ERROR: 1.0,  # blamed only when it repeated on that node and on no other
        ev.UNKNOWN: 0.25,
        "straggler": 0.25,  # a mark_suspect action for a straggler warning
        "loss_spike": 0.25,  # (struck only when policy.strike_on_warnings lists it)
    }
)
WARNING_STRIKES = ("straggler", "loss_spike")


@dataclass(frozen=True)
class LedgerConfig:
    half_life_s: float = 6 * 3600.0
    threshold: float = 1.0
    weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_WEIGHTS)  # class (or "straggler") -> strike
    sticky: tuple[str, ...] = (ev.HARDWARE,)  # classes whose strikes never fade (until an operator forgives)

    def __post_init__(self) -> None:
        for name in ("half_life_s", "threshold"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"ledger.{name} must be a positive number, got {value!r}")
        known = (*ev.INTERRUPTION_CLASSES, *WARNING_STRIKES)
        merged = dict(DEFAULT_WEIGHTS)
        for key, weight in self.weights.items():
            if key not in known:
                raise ValueError(f"ledger.weights: unknown key {key!r}; use one of {', '.join(known)}")
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight < 0:
                raise ValueError(f"ledger.weights.{key} must be a number >= 0, got {weight!r}")
            merged[key] = float(weight)
        object.__setattr__(self, "weights", MappingProxyType(merged))
        if isinstance(self.sticky, str) or not all(isinstance(c, str) for c in self.sticky):
            raise ValueError(f"ledger.sticky must be a list of classes, got {self.sticky!r}")
        for cls in self.sticky:
            if cls not in known:
                raise ValueError(f"ledger.sticky: unknown class {cls!r}; use one of {', '.join(known)}")
        object.__setattr__(self, "sticky", tuple(self.sticky))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LedgerConfig:
        """From a config file's ``[ledger]`` table; unknown keys are errors."""
        for key in data:
            if key not in ("half_life_s", "threshold", "weights", "sticky"):
                raise ValueError(f"ledger.{key}: unknown setting; known settings: half_life_s, threshold, weights, "
                                 "sticky")
        return cls(**dict(data))


@dataclass
class NodeRecord:
    score: float  # as of ``t``
    t: float
    strikes: int = 0
    last_reason: str = ""
    fixed: float = 0.0  # the part that never fades (strikes of sticky classes)


class Ledger:
    def __init__(self, config: LedgerConfig | None = None) -> None:
        self.config = config or LedgerConfig()
        self.nodes: dict[str, NodeRecord] = {}
        self._out_for_good: set[str] = set()  # sticky strikes at the threshold: excluded until forgiven

    def _decay(self, score: float, dt: float) -> float:
        return score * 2.0 ** (-max(0.0, dt) / self.config.half_life_s)

    def score(self, node: str, now: float) -> float:
        record = self.nodes.get(node)
        return 0.0 if record is None else self._decay(record.score, now - record.t) + record.fixed

    def strike(self, node: str, weight: float, t: float, reason: str = "") -> None:
        if weight <= 0:
            return
        record = self.nodes.get(node)
        fixed = weight if reason in self.config.sticky else 0.0
        fading = weight - fixed
        if record is None:
            self.nodes[node] = NodeRecord(fading, t, 1, reason, fixed)
        elif t >= record.t:
            self.nodes[node] = NodeRecord(self._decay(record.score, t - record.t) + fading, t, record.strikes + 1, reason,
                                          record.fixed + fixed)  # fmt: skip
        else:  # an older event arriving late: age it to the record's time instead
            record.score += self._decay(fading, record.t - t)
            record.fixed += fixed
            record.strikes += 1
        if self.nodes[node].fixed >= self.config.threshold:
            self._out_for_good.add(node)

    def forgive(self, node: str, t: float) -> None:
        record = self.nodes.get(node)
        if record is not None:
            self.nodes[node] = NodeRecord(0.0, max(t, record.t), record.strikes, "forgiven by an operator")
            self._out_for_good.discard(node)

    def excluded_nodes(self, now: float) -> frozenset[str]:
        # Runs once per decision: nodes out for good are not scored again (a simulated 131,072-GPU campaign
        # holds thousands), the others with score() inlined.
        threshold, half_life, out = self.config.threshold, self.config.half_life_s, self._out_for_good
        scored = ((n, self.nodes[n]) for n in self.nodes.keys() - out)
        return frozenset(out).union(
            n for n, r in scored if r.fixed + r.score * 2.0 ** (-max(0.0, now - r.t) / half_life) >= threshold
        )

    def table(self, now: float) -> list[dict[str, Any]]:
        """Rows for ``supervise nodes``: worst first."""
        rows = [
            {
                "node": node,
                "score": round(self.score(node, now), 4),
                "excluded": self.score(node, now) >= self.config.threshold,
                "strikes": record.strikes,
                "last_strike_t": record.t,
                "last_reason": record.last_reason,
            }
            for node, record in self.nodes.items()
        ]
        return sorted(rows, key=lambda r: (-r["score"], r["node"]))

    def apply(self, event: Mapping[str, Any]) -> None:
        """Fold one journal event in (unknown events are ignored)."""
        kind = event.get("type")
        t = float(event.get("t", 0.0))
        if kind == ev.INTERRUPTION:
            weight = self.config.weights.get(str(event.get("class")), 0.0)
            for node in event.get("blamed_nodes", ()):
                self.strike(str(node), weight, t, str(event.get("class")))
        elif kind == ev.ACTION and event.get("kind") == "mark_suspect":
            # policy.MARK_SUSPECT (warnings): params.strike names the weight; the detection itself never strikes
            params = event.get("params") or {}
            reason = str(params.get("strike", "")) if isinstance(params, Mapping) else ""
            for node in event.get("target", ()):
                self.strike(str(node), self.config.weights.get(reason, 0.0), t, reason)
        elif kind == ev.PREFLIGHT:
            # A node found unfit or markedly slow before a launch: struck as a hardware fault; an unfit one (a
            # fatal health check) as one that does not fade when hardware is sticky, a slow one fading.
            unfit = set(event.get("unfit", ()))
            for node in event.get("blamed_nodes", ()):
                reason = ev.HARDWARE if node in unfit else "preflight"
                self.strike(str(node), self.config.weights.get(ev.HARDWARE, 0.0), t, reason)
        elif kind == ev.NODE_FORGIVEN and event.get("node"):
            self.forgive(str(event["node"]), t)

    @classmethod
    def fold(cls, events: Iterable[Mapping[str, Any]], config: LedgerConfig | None = None) -> Ledger:
        ledger = cls(config)
        for event in events:
            ledger.apply(event)
        return ledger

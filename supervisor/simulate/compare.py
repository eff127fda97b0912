"""One simulation run, three answers: (a) naive Slurm requeue, (b) this supervisor, (c) the Young/Daly optimum.

Both strategies play the same trace. The text table and the JSON document are built here so the command, the
bench and the plot all show the same numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from supervisor.simulate import engine
from supervisor.simulate.trace import Fault

RATIO_FLOOR = 0.001  # (a)'s goodput below which a ratio to it is noise, not a comparison


@dataclass(frozen=True)
class Comparison:
    world: engine.World
    faults: int
    naive: engine.Outcome
    supervised: engine.Outcome
    optimum: engine.Optimum

    @property
    def ratio(self) -> float | None:
        """(b)'s goodput over (a)'s; None where (a) kept under 0.1 % of the wall clock (at 131,072 GPUs an hourly
        synchronous checkpoint rarely commits before the next fault: a few seconds kept made "1252x")."""
        return self.supervised.goodput / self.naive.goodput if self.naive.goodput >= RATIO_FLOOR else None

    def to_dict(self) -> dict[str, Any]:
        w = self.world
        return {
            "world": {"gpus": w.gpus, "nodes": w.nodes, "days": w.days, "seed": w.seed, "faults": self.faults,
                      "mtbf_s": round(self.optimum.mtbf_s, 2), "hang_fraction": w.hang_fraction,
                      "bad_node_p": w.bad_node_p, "recur_mean_s": w.recur_mean_s,
                      "site_drain_after": w.site_drain_after},
            "naive": self.naive.to_dict(),
            "supervised": self.supervised.to_dict(),
            "young_daly": self.optimum.to_dict(),
            "supervised_over_naive": None if self.ratio is None else round(self.ratio, 3),
            "points_below_optimum": round(100 * (self.optimum.goodput - self.supervised.goodput), 2),
        }  # fmt: skip


def compare(world: engine.World, faults: Sequence[Fault], naive: engine.Strategy, supervised: engine.Strategy
            ) -> Comparison:  # fmt: skip
    return Comparison(
        world, len(faults), engine.simulate(world, naive, faults), engine.simulate(world, supervised, faults),
        engine.optimum(world, faults, supervised.stall_s, supervised.restart_s),
    )


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f}"


def render_text(c: Comparison) -> str:
    w, o = c.world, c.optimum
    lines = [
        f"campaign: {w.gpus:,} GPUs ({w.nodes:,} nodes), {w.days:g} days, {c.faults} faults in the trace "
        f"(MTBF {o.mtbf_s / 3600:.2f} h), seed {w.seed}",
        "hours of wall clock per bucket:",
        f"{'':24} {'goodput':>8} " + " ".join(f"{b:>10}" for b in engine.BUCKETS) + f" {'faults':>7} {'again':>6}",
    ]
    for label, out in (("(a) naive Slurm requeue", c.naive), ("(b) this supervisor", c.supervised)):
        lines.append(f"{label:24} {out.goodput:>8.1%} " + " ".join(f"{_hours(out.buckets[b]):>10}" for b in engine.BUCKETS)
                     + f" {sum(out.interruptions.values()):>7} {out.recurrences:>6}")  # fmt: skip
    lines.append(f"{'(c) Young/Daly optimum':24} {o.goodput:>8.1%}  (1 - sqrt(2 delta/M) - R/M with delta = "
                 f"{o.stall_s:g} s, R = {o.restart_s:g} s, M = {o.mtbf_s / 3600:.2f} h; interval {o.interval_s:.0f} s)")
    s = c.supervised
    ratio = "-" if c.ratio is None else f"{c.ratio:.2f}x"
    lines.append(f"(b)/(a) = {ratio}; (b) is {100 * (o.goodput - s.goodput):.2f} points below (c); (b) relaunched "
                 f"{s.relaunches}x in place ({s.warm_restarts} of them warm), requeued {s.requeues}x, stopped for a person {s.stops}x, mean checkpoint "
                 f"interval {s.to_dict()['mean_interval_s']} s")  # fmt: skip
    lines.append("(b) interruptions by class: " + ", ".join(f"{k} {v}" for k, v in sorted(s.interruptions.items())))
    lines.append("(b) badput by class, h: " + ", ".join(f"{k} {_hours(v)}" for k, v in
                                                           sorted(s.badput_by_class.items(), key=lambda kv: -kv[1])))  # fmt: skip
    return "\n".join(lines)

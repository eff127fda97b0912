"""Preflight before a launch: a short measurement on every node (``preflight_worker`` under srun) and a pure
judgement that flags a node markedly slower than its peers, so it can be excluded (or swapped for a spare)
before training starts. Standalone: the supervision loop decides when to call :func:`run` and what to do with
the :class:`Verdict` (journal ``verdict.to_event(t)``, exclude ``verdict.blamed_nodes``).

Judgement (``judge``): only when every rank reported (a failed or missing rank makes the verdict "unknown":
nobody is blamed on missing data). The rule itself is ``decisions/slow_nodes.py``: a node is left out only when it
is slower than its peers (``factor``, and an absolute floor) in 3/4 of the measurement rounds, and what its slowness
would cost the training is more than what leaving it out costs (a spare, or a requeue when none is left).
Nodes slower but not worth leaving out are kept and named in ``Verdict.kept``.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from slurm import srun
from supervisor.decisions import slow_nodes
from supervisor.decisions.slow_nodes import DEFAULT_COSTS, Costs

Starter = Callable[[Sequence[str], Mapping[str, str], Path, "str | None"], Any]  # driver.launcher.start's shape
DEFAULT_BUDGET_S = 30.0
DEFAULT_FACTOR = 2.0
SRUN_SLACK_S = 20.0  # srun's own start-up and tear-down, beyond the workers' budget


@dataclass(frozen=True)
class PreflightConfig:
    """``[preflight]`` (docs/configuration.md): when the collective test runs before a launch, its time budget,
    and how much slower than its peers a node must be to be left out."""

    enabled: str | bool = "auto"  # "auto": when the launch has nodes not measured yet, or hurt since (a relaunch)
    budget_s: float = DEFAULT_BUDGET_S
    factor: float = DEFAULT_FACTOR
    srun_args: tuple[str, ...] = ()  # extra srun arguments for the measurement step (e.g. ["--gpus-per-task=1"])
    horizon_s: float = Costs.horizon_s  # the cost model (decisions/slow_nodes.py)
    requeue_cost_s: float = Costs.requeue_cost_s

    @property
    def costs(self) -> Costs:
        return Costs(horizon_s=self.horizon_s, requeue_cost_s=self.requeue_cost_s)

    def __post_init__(self) -> None:
        if self.enabled not in ("auto", True, False):
            raise ValueError(f'preflight.enabled must be "auto", true or false, got {self.enabled!r}')
        for name, low, high in (("budget_s", 1.0, 600.0), ("factor", 1.0, 1000.0), ("horizon_s", 60.0, 2.592e6),
                                ("requeue_cost_s", 0.0, 2.592e6)):  # fmt: skip
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or not low <= value <= high or (name == "factor" and value == low):  # fmt: skip
                raise ValueError(f"preflight.{name} must be a number in {'(' if name == 'factor' else '['}{low:g}, "
                                 f"{high:g}], got {value!r}")  # fmt: skip
        if isinstance(self.srun_args, str) or not all(isinstance(a, str) for a in self.srun_args):
            raise ValueError(f"preflight.srun_args must be a list of strings, got {self.srun_args!r}")
        object.__setattr__(self, "srun_args", tuple(self.srun_args))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> PreflightConfig:
        known = ("enabled", "budget_s", "factor", "srun_args", "horizon_s", "requeue_cost_s")
        for key in data:
            if key not in known:
                raise ValueError(f"preflight.{key}: unknown setting; known settings: {', '.join(known)}")
        return cls(**dict(data))


@dataclass(frozen=True)
class Verdict:
    ok: bool  # every rank measured and no node is worth leaving out
    unknown: bool  # some rank failed or did not report: nothing can be concluded
    slow: Mapping[str, str] = field(default_factory=dict)  # node -> why: left out
    kept: Mapping[str, str] = field(default_factory=dict)  # node -> why: slower, but not worth leaving out
    errors: Mapping[str, str] = field(default_factory=dict)  # node -> the worker's error (or "no result")
    figures: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # node -> measured values
    allreduce_busbw_Bps: float | None = None
    elapsed_s: float | None = None

    @property
    def blamed_nodes(self) -> tuple[str, ...]:
        return tuple(sorted(self.slow))

    def to_event(self, t: float) -> dict[str, Any]:
        """Journal form: ``{"type": "preflight", ...}``."""
        doc = asdict(self)
        doc.update(type="preflight", t=t, blamed_nodes=list(self.blamed_nodes))
        return doc


def judge(results: Sequence[Mapping[str, Any]], nodes: Sequence[str], factor: float = DEFAULT_FACTOR,
          elapsed_s: float | None = None, spares: int = 0, costs: Costs = DEFAULT_COSTS) -> Verdict:  # fmt: skip
    """``results``: the workers' ``rank-N.json`` documents; ``nodes``: the nodes that were asked; ``spares``: how
    many of them the training can do without (a slow node beyond them costs a requeue to leave out)."""
    if not factor > 1:
        raise ValueError(f"preflight factor must be > 1, got {factor!r}")
    by_node = {str(r.get("node")): r for r in results if isinstance(r, Mapping)}
    errors = {n: str(by_node[n].get("error") or "failed") for n in nodes if n in by_node and not by_node[n].get("ok")}
    errors.update({n: "no result (the worker did not start or was killed)" for n in nodes if n not in by_node})
    busbw = next((_num(r.get("allreduce_busbw_Bps")) for r in results if r.get("rank") == 0), None)
    if errors:
        return Verdict(False, True, errors=errors, allreduce_busbw_Bps=busbw, elapsed_s=elapsed_s)
    rank_node = {int(r["rank"]): str(r["node"]) for r in by_node.values() if isinstance(r.get("rank"), int)}
    figures: dict[str, dict[str, float]] = {n: {} for n in nodes}
    rounds: dict[str, dict[str, list[float]]] = {n: {} for n in nodes}
    for n, r in by_node.items():
        if _num(r.get("compute_s")) is not None:
            figures.setdefault(n, {})["compute_s"] = float(r["compute_s"])
            rounds.setdefault(n, {})[slow_nodes.COMPUTE] = _series(r.get("compute_rounds_s"), r["compute_s"])
    root = next((r for r in by_node.values() if r.get("rank") == 0), {})
    for peer, p in (root.get("p2p") or {}).items():
        node = rank_node.get(int(peer)) if str(peer).isdigit() else None
        if node is None or not isinstance(p, Mapping):
            continue
        for key, metric, per_round in (("latency_s", slow_nodes.LATENCY, "latency_rounds_s"),
                                       ("bandwidth_Bps", slow_nodes.BANDWIDTH, "bandwidth_rounds_Bps")):  # fmt: skip
            if _num(p.get(key)) is not None:
                figures.setdefault(node, {})[key] = float(p[key])
                rounds.setdefault(node, {})[metric] = _series(p.get(per_round), p[key])
    slower = slow_nodes.slower_nodes(rounds, factor, costs)
    out, kept = slow_nodes.leave_out(slower, spares, costs)
    return Verdict(not out, False, slow=out, kept=kept, figures=figures, allreduce_busbw_Bps=busbw,
                   elapsed_s=elapsed_s)  # fmt: skip


def _series(values: Any, single: Any) -> list[float]:
    """A figure's per-round values (a worker from before rounds reported one figure: one round)."""
    if isinstance(values, list) and values and all(_num(v) is not None for v in values):
        return [float(v) for v in values]
    return [float(single)]


def _num(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def worker_argv(nodes: Sequence[str], out_dir: Path, budget_s: float = DEFAULT_BUDGET_S,
                python: str = sys.executable, srun_args: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """The srun line: one task per node, overlapping the agents' step, with a step time limit."""
    minutes = max(1, math.ceil((budget_s + SRUN_SLACK_S) / 60))
    return srun.preflight(nodes, [python, "-m", "supervisor.health.preflight_worker", "--out", str(out_dir),
                                  "--budget-s", f"{budget_s:g}"], minutes=minutes, extra=srun_args)  # fmt: skip


def run(nodes: Sequence[str], work_dir: Path, budget_s: float = DEFAULT_BUDGET_S, factor: float = DEFAULT_FACTOR,
        env: Mapping[str, str] | None = None, python: str = sys.executable,
        srun_args: Sequence[str] = (), start: Starter | None = None,
        log_path: Path | None = None, spares: int = 0, costs: Costs = DEFAULT_COSTS) -> Verdict:  # fmt: skip
    """Measure ``nodes`` (in the current allocation, or a new one outside) and judge; never raises for a failed
    measurement (that is an "unknown" verdict). ``work_dir`` must be on a filesystem every node sees.
    ``start``: how to start the srun (the supervisor's step launcher, output to ``log_path``); default: a
    subprocess with its output discarded."""
    if not 1 <= budget_s <= 600:
        raise ValueError(f"preflight budget must be 1-600 s, got {budget_s!r}")
    work_dir.mkdir(parents=True, exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix="preflight-", dir=work_dir))
    argv = worker_argv(nodes, out, budget_s, python, srun_args)
    started = time.monotonic()
    try:
        if start is not None:
            proc: Any = start(argv, dict(env) if env is not None else dict(os.environ), log_path or out / "srun.log",
                              None)  # fmt: skip
        else:
            proc = subprocess.Popen(argv, env=dict(env) if env is not None else None, stdout=subprocess.DEVNULL,  # noqa: S603
                                    stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    except OSError as err:
        return Verdict(False, True, errors={n: f"cannot run srun: {err}" for n in nodes})
    deadline = started + budget_s + SRUN_SLACK_S
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    _end(proc)
    elapsed = time.monotonic() - started
    return judge(read_results(out), nodes, factor, round(elapsed, 3), spares=spares, costs=costs)


def read_results(out: Path) -> list[dict[str, Any]]:
    """The workers' ``rank-N.json`` documents in ``out`` (one that cannot be read is missing: judged unknown)."""
    results = []
    for path in sorted(out.glob("rank-*.json")):
        try:
            results.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return results


def _end(proc: Any) -> None:
    """srun past its deadline: TERM (srun ends the step), then KILL."""
    for stop in (proc.terminate, proc.kill):
        if proc.poll() is not None:
            return
        stop()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            continue


def describe(verdict: Verdict) -> str:
    """One line for the log and the journal's reader."""
    if verdict.unknown:
        return "preflight inconclusive: " + "; ".join(f"{n}: {e}" for n, e in sorted(verdict.errors.items()))
    kept = "; slower but kept: " + "; ".join(f"{n}: {why}" for n, why in sorted(verdict.kept.items())) \
        if verdict.kept else ""  # fmt: skip
    if verdict.slow:
        return "preflight: slow " + "; ".join(f"{n}: {why}" for n, why in sorted(verdict.slow.items())) + kept
    bw = f", all-reduce {verdict.allreduce_busbw_Bps / 1e6:.0f} MB/s" if verdict.allreduce_busbw_Bps else ""
    return f"preflight ok on {len(verdict.figures)} nodes{bw}{kept}"


if __name__ == "__main__":  # python -m supervisor.health.preflight NODE... (a manual check inside an allocation)
    from slurm.hostlist import expand

    nodes = sys.argv[1:] or expand(os.environ.get("SLURM_JOB_NODELIST", ""))
    v = run(nodes, Path(os.environ.get("TMPDIR", "/tmp")))
    print(describe(v))
    sys.exit(0 if v.ok else 1)

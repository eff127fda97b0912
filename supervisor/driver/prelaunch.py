"""Before each launch: leave out the nodes that would fail or slow the training (``[preflight]``).

1. **Health.** The node agents check their nodes at start (``driver/health_watch.py``); before the first launch the
   supervisor waits (up to the budget) until every node whose agent reported has sent its first health report.
   A node with a fatal finding is unfit.
2. **Collective test.** ``health.preflight.run``: a short srun step, one task per candidate node (spares
   included, so a slow node can be swapped for one), measures compute, point-to-point latency and bandwidth to
   rank 0 and an all-reduce (torch.distributed: gloo on CPU, NCCL where the ranks see GPUs), and flags a node
   markedly slower than its peers (``factor``). ``enabled = "auto"`` runs it when the launch would use nodes not
   measured yet in this Slurm run, or hurt since (a node blamed for a hang, a hardware fault, a node failure or a
   communication error is measured again before a relaunch uses it: the fault may have left it slow), true before
   every launch, false never. An inconclusive measurement (a rank failed, torch missing) blames nobody. A node
   is left out only for a slowness that persists and matters (``decisions/slow_nodes.py``: 3/4 of the rounds, a floor,
   and a cost model that weighs the training's slowdown against the spare or the requeue leaving it out costs).
3. **Verdict.** Unfit and slow nodes are added to the launch's exclusions when enough nodes remain (the spares
   take their place); otherwise the loop answers with an :class:`Evidence` of a hardware fault on them (the policy
   requeues the job without them, or stops when the budget is spent): the training never starts on them.

Every check is journaled as one ``preflight`` event; the ledger strikes its blamed nodes.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.agent.discover import HELPER_ENV
from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.driver.context import Context
from supervisor.driver.health_watch import HealthWatch, detections, gpu_faults
from supervisor.driver.ports import StepLauncher
from supervisor.health import preflight

Runner = Callable[..., preflight.Verdict]
# The verdicts that could have hurt the nodes they blame: a relaunch measures those nodes again ("auto").
HURTING = frozenset({ev.HANG, ev.HARDWARE, ev.NODE_FAILURE, ev.COMM_ERROR})


class NotStarted:
    """The process of a launch that never started (the preflight left too few nodes): it has "exited"."""

    returncode: int | None = 0

    def poll(self) -> int | None:
        return 0

    def wait(self, timeout: float | None = None) -> int:
        return 0

    def terminate(self) -> None:
        return None

    def kill(self) -> None:
        return None


@dataclass(frozen=True)
class Checked:
    """The preflight's answer: the launch's exclusions, and what was found on which node."""

    excluded: tuple[str, ...]  # the exclusions the launch should use (earlier ones + the blamed nodes)
    blamed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # node -> evidence lines
    enough: bool = True  # enough nodes remain for the training
    evidence: cl.Evidence | None = None  # when not enough: the hardware fault to respond to


class Prelaunch:
    def __init__(
        self, ctx: Context, *, config: preflight.PreflightConfig, health: HealthWatch, channel: Any, work_dir: Path,
        python: str, env: Mapping[str, str], start: StepLauncher, log_dir: Path, health_enabled: bool = True,
        runner: Runner = preflight.run,
    ) -> None:  # fmt: skip
        """``env``: the measurement step's environment; ``log_dir``: where its srun output goes (this attempt's)."""
        self.record, self.clock = ctx.record, ctx.clock
        self.config, self.health, self.channel = config, health, channel
        self.work_dir, self.python, self.env, self.health_enabled = work_dir, python, env, health_enabled
        self.start, self.log_dir, self.runner = start, log_dir, runner
        self.runs = 0
        self.measured: set[str] = set()  # nodes a conclusive collective test measured in this Slurm run
        self.hurt: set[str] = set()  # measured, then blamed by a verdict that could have hurt them: measured again
        self.no_torch = ""  # why the collective test cannot run here (found once, then skipped)

    def check(self, nodes: Sequence[str], excluded: Sequence[str], needed: int, launch: int) -> Checked:
        """``nodes``: the allocation; ``excluded``: what the launch would leave out anyway; ``needed``: nodes
        the training uses. Never raises for a failed measurement (it is inconclusive)."""
        started = time.monotonic()
        candidates = [n for n in nodes if n not in set(excluded)]
        if self.health_enabled and self.config.enabled is not False:
            self._await_reports(candidates, started + self.config.budget_s)
        self.health.update(self.channel.table)
        unfit = self.health.faults(candidates)
        fit = [n for n in candidates if n not in unfit]
        verdict, skipped = None, self._skip_reason(fit)
        if skipped is None:
            verdict = self._measure(fit, max(1.0, self.config.budget_s - (time.monotonic() - started)),
                                    spares=len(fit) - needed)  # fmt: skip
        slow = dict(verdict.slow) if verdict is not None and not verdict.unknown else {}
        blamed: dict[str, tuple[str, ...]] = dict(gpu_faults(unfit))
        for node, why in slow.items():
            blamed[node] = (f"preflight: {why}",)
        new_excluded = tuple(sorted(set(excluded) | set(blamed)))
        enough = len(nodes) - len(new_excluded) >= needed
        self.record(ev.preflight(
            self.clock(), candidates, round(time.monotonic() - started, 3), unfit=sorted(unfit), launch=launch,
            blamed_nodes=sorted(blamed), enough=enough, unfit_checks={n: [i.check for i in items] for n, items in
                                                                      unfit.items()},
            slow=slow, errors=dict(verdict.errors) if verdict is not None else {}, skipped=skipped,
            figures={n: dict(f) for n, f in verdict.figures.items()} if verdict is not None else {},
            allreduce_busbw_Bps=verdict.allreduce_busbw_Bps if verdict is not None else None,
            kept=dict(verdict.kept) if verdict is not None else {},
            retested=sorted(self.hurt & set(fit)) if verdict is not None else [],
        ))  # fmt: skip
        if verdict is not None and not verdict.unknown:
            self.hurt.difference_update(fit)
        if enough:
            return Checked(new_excluded, blamed)
        findings = detections(unfit) + tuple(_slow_detection(n, why) for n, why in sorted(slow.items()))
        evidence = cl.Evidence(gpu_faults=blamed, health_findings=findings, allocation_nodes=tuple(candidates),
                               job_nodes=tuple(nodes))  # fmt: skip
        return Checked(tuple(excluded), blamed, False, evidence)

    def after(self, cls: str, blamed: Sequence[str]) -> None:
        """An interruption of class ``cls`` blamed ``blamed``: the nodes it could have hurt are measured again
        before a launch uses them (their measurement's time is journaled, and counted as preflight time)."""
        if cls in HURTING:
            self.hurt.update(n for n in blamed if n in self.measured)
            self.measured.difference_update(blamed)

    def _await_reports(self, nodes: Sequence[str], deadline: float) -> None:
        """Until every node whose agent reported has sent a health report (the first comes at agent start)."""
        table = self.channel.table
        while time.monotonic() < deadline:
            waiting = [n for n in nodes if n in table.nodes and n not in getattr(table, "health", {})]
            if not waiting:
                return
            self.channel.poll(0.1)

    def _skip_reason(self, fit: Sequence[str]) -> str | None:
        enabled = self.config.enabled
        if enabled is False:
            return "preflight.enabled = false"
        if len(fit) < 2:
            return "fewer than two nodes to compare"
        if self.no_torch:
            return self.no_torch
        if enabled == "auto" and set(fit) <= self.measured:
            return "these nodes were measured earlier in this Slurm run"
        return None

    def _measure(self, nodes: Sequence[str], budget_s: float, spares: int) -> preflight.Verdict:
        self.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        before = set(self.work_dir.iterdir())
        self.runs += 1
        try:
            verdict = self.runner(list(nodes), self.work_dir, budget_s=budget_s, factor=self.config.factor,
                                  env={**self.env, HELPER_ENV: "preflight"}, python=self.python,
                                  srun_args=["--mem=0", *self.config.srun_args], start=self.start,
                                  log_path=self.log_dir / f"preflight-{self.runs}.log", spares=spares,
                                  costs=self.config.costs)  # fmt: skip
        finally:
            for path in set(self.work_dir.iterdir()) - before:  # the rendezvous files, pid files, results
                shutil.rmtree(path, ignore_errors=True)
        if not verdict.unknown:
            self.measured.update(nodes)
        elif verdict.errors and all("No module named 'torch'" in e for e in verdict.errors.values()):
            self.no_torch = f"torch is not importable by {self.python} on the nodes (the collective test needs it)"
        return verdict


def _slow_detection(node: str, why: str) -> dict[str, Any]:
    return {"kind": ev.HARDWARE, "metric": "preflight", "value": why, "threshold": "peers' median x factor",
            "duration_s": None, "nodes": [node], "evidence": [f"preflight: {why}"]}  # fmt: skip


def not_started(number: int, log_path: Path) -> Any:
    """A Launch that never ran (for the actuators of a decision taken before the launch)."""
    from supervisor.driver.launcher import Launch

    return Launch(number, "preflight", NotStarted(), log_path, time.monotonic(), ())


"""The site's repair loop (operator opt-in: ``supervise site serve --repair``): every round it reads Slurm's nodes,
works out what counts as bad for everyone (``decisions/site_trust.py``'s rule: node- or Slurm-read verdicts
since the node was last forgiven, and the lemons), asks ``decisions/repair.py`` for the plan and carries it out
through the real ``scontrol`` (drain, ``reboot ASAP nextstate=RESUME``, resume), recording every step, and any
Slurm refusal, in the site database. It decides nothing itself; a failed round is recorded and the next one
tries again (the service never dies of it).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from supervisor.decisions.lemon import LemonConfig, score_nodes
from supervisor.decisions.repair import BACK_WAIT, REASON_TAG, Held, NodeNow, RepairConfig, Step, plan
from supervisor.decisions.site_trust import CROSSES_USERS
from supervisor.site.store import SiteStore

HEALTH_MARGIN_S = 5.0  # beyond HealthCheckInterval: the check's own run time and the loop's round


class RepairLoop:
    def __init__(self, store: SiteStore, slurm: Any, lock: threading.Lock, clock: Callable[[], float] = time.time,
                 config: RepairConfig | None = None, lemon: LemonConfig | None = None) -> None:  # fmt: skip
        """``lock``: the one the API holds around the store (one SQLite connection)."""
        self.store, self.slurm, self.lock, self.clock = store, slurm, lock, clock
        self.config, self.lemon = config or RepairConfig(), lemon or LemonConfig()

    def round(self) -> list[Step]:
        nodes = {n.name: NodeNow(n.name, n.state, n.is_drain, n.reason) for n in self.slurm.nodes()}
        config = replace(self.config, health_wait_s=self._health_wait_s())
        with self.lock:
            now = self.clock()
            forgiven, rebooted = self._history()
            steps = plan(nodes, self._held(now), forgiven, rebooted, config, self._back_since(rebooted), now)
        for step in steps:
            error = None
            try:
                if step.kind == "drain":
                    self.slurm.drain([step.node], step.reason)
                elif step.kind == "reboot":
                    self.slurm.reboot([step.node], step.reason)
                elif step.kind == "resume":
                    self.slurm.resume([step.node])
            except Exception as err:  # noqa: BLE001 - a refusal is recorded; the next round tries again
                error = str(getattr(err, "problem", err))[:500]
            with self.lock:
                if step.kind == "forgive" and error is None:
                    self.store.forgive(step.node, self.clock(), by="repair loop")
                if not self._same_as_last(step.node, step.kind, error, step.reason):  # a wait or a refusal once, not every round
                    self.store.add_repair(self.clock(), step.node, step.kind, step.reason, error)
        return steps

    def _held(self, now: float) -> dict[str, Held]:
        since = now - self.lemon.window_s
        forgiven = self.store.forgiven_at()
        held: dict[str, list[str]] = {}
        for v, evidence in self.store.verdict_rows(since):
            if v.source in CROSSES_USERS and v.t >= forgiven.get(v.node, float("-inf")):
                held.setdefault(v.node, []).insert(0, evidence[0] if evidence else f"{v.klass} ({v.source})")
        out = {node: Held(tuple(lines)) for node, lines in held.items()}
        for s in score_nodes(self.store.failures(since, now), self.store.exposure_h(since, now), now, self.lemon):
            if s.lemon:
                out[s.node] = Held((s.why, *out.get(s.node, Held(())).evidence), lemon=True)
        return out

    def _history(self) -> tuple[set[str], set[str]]:
        """(nodes forgiven since the loop last drained them, nodes the loop rebooted since it last drained them)."""
        forgiven_at = self.store.forgiven_at()
        drained: dict[str, float] = {}
        rebooted: dict[str, float] = {}
        for r in self.store.repairs():
            if r["error"] is None and r["kind"] == "drain":
                drained[str(r["node"])] = float(r["t"])  # type: ignore[arg-type]
            elif r["kind"] == "reboot":  # tried, even if Slurm refused (no RebootProgram): once, then a person
                rebooted[str(r["node"])] = float(r["t"])  # type: ignore[arg-type]
        forgiven = {n for n, t in drained.items() if forgiven_at.get(n, float("-inf")) > t}
        back = {n for n, t in rebooted.items() if t >= drained.get(n, float("-inf"))
                and forgiven_at.get(n, float("-inf")) < t}  # fmt: skip
        return forgiven, back

    def _health_wait_s(self) -> float:
        """HealthCheckInterval + 5 s when Slurm runs a HealthCheckProgram (read every round: an operator may add
        one), else 0; a failed read counts as one being there at the default interval (never forgive early)."""
        try:
            conf = self.slurm.config()
        except Exception:  # noqa: BLE001 - unknown: wait as if a check ran every 5 minutes
            return 300.0 + HEALTH_MARGIN_S
        program = conf.get("HealthCheckProgram", "")
        interval = conf.get("HealthCheckInterval", "0").split()[0]
        if not program or program == "(null)" or not interval.isdigit() or int(interval) == 0:
            return 0.0
        return int(interval) + HEALTH_MARGIN_S

    def _back_since(self, rebooted: set[str]) -> dict[str, float]:
        """For each rebooted node whose last record is the loop's ``BACK_WAIT``: when that was recorded."""
        last: dict[str, dict[str, object]] = {}
        for r in self.store.repairs():
            last[str(r["node"])] = r
        return {n: float(r["t"]) for n, r in last.items()  # type: ignore[arg-type]
                if n in rebooted and r["kind"] == "wait" and r["reason"] == BACK_WAIT}

    def _same_as_last(self, node: str, kind: str, error: str | None, reason: str = "") -> bool:
        last = [r for r in self.store.repairs() if r["node"] == node][-1:]
        return bool(last) and last[0]["kind"] == kind and (
            (kind == "wait" and last[0]["reason"] == reason[:500]) or (error is not None and last[0]["error"] == error))


def serve_repairs(loop: RepairLoop, every_s: float, stop: threading.Event, log: Callable[[str], None]) -> None:
    """Rounds every ``every_s`` until ``stop``; a failed round is logged and the next one tries again."""
    while not stop.wait(every_s):
        try:
            for step in loop.round():
                if step.kind != "wait":
                    log(f"repair: {step.kind} {step.node}: {step.reason}")
        except Exception as err:  # noqa: BLE001 - Slurm away, the database busy: the next round
            log(f"repair: round failed ({err}); trying again in {every_s:.0f} s")


__all__ = ["REASON_TAG", "RepairLoop", "serve_repairs"]

"""``supervise run``: the supervisor loop of one Slurm attempt (the batch step).

It starts the aggregator and the node agents, picks the checkpoint to resume from, launches the training
step with srun and watches it: detections come from the pure detectors, the class of an interruption from
the pure classifier, the response from the pure policy. This module is the edge that feeds them and carries
out their decisions; every decision is journaled before it is carried out.
"""

from __future__ import annotations

import dataclasses
import math
import os
import secrets
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from slurm.cli_backend import CliSlurmClient
from slurm.env import SlurmEnv
from slurm.hostlist import compress
from supervisor import procstate
from supervisor.campaign import CampaignSpec
from supervisor.config import Config
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions.classify import RankExit, signatures_from_table
from supervisor.decisions.detect import (
    HANG_KINDS,
    NODE_SILENT,
    RANK_EXITED,
    DetectConfig,
    DetectionEvent,
    Detector,
    snapshot_from_live,
)
from supervisor.decisions.ledger import Ledger, LedgerConfig
from supervisor.decisions.respond import StepEnding, infer_previous_outcome, last_step, respond
from supervisor.driver import launcher
from supervisor.driver.actuators import Actuators, slot_flag
from supervisor.driver.launcher import Step
from supervisor.driver.signals import Received, SignalInbox
from supervisor.heartbeat import wire
from supervisor.heartbeat.server import BIND_ENV, AggregatorServer, bind_address, resolve_sources
from supervisor.journal import Journal
from supervisor.paths import SLOT_DIR_ENV, CampaignPaths, slot_dir_template

log = structlog.get_logger("supervisor")

AGENT_START_TIMEOUT_S = 60.0  # node agents start with the python interpreter: seconds on a loaded node
AGENT_RESTART_MIN_S = 10.0  # at most one restart of the agents' step per this many seconds
CHECKPOINT_SCAN_S = 5.0
TIMEOUTS_JOURNAL_S = 600.0  # learned timeouts are journaled this often (and whenever a step ends)
TIMEOUTS_LEARNED = "timeouts_learned"
SLURM_TERM_WAIT_S = 30.0  # when Slurm is ending the job, how long its own SIGTERM/SIGKILL may take  # how often the checkpoint directory is looked at for new valid checkpoints
EXIT_GRACE_S = 5.0  # a rank gone while srun still runs for this long is a fault (not a normal finish)


def _tail(path: Path, max_bytes: int = 65536) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - max_bytes))
            return f.read().decode(errors="replace").splitlines()[-400:]
    except OSError:
        return []


class Supervisor(Actuators):
    def __init__(
        self,
        paths: CampaignPaths,
        spec: CampaignSpec,
        config: Config,
        env: SlurmEnv,
        slurm: CliSlurmClient,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.paths, self.spec, self.config, self.env, self.slurm = paths, spec, config, env, slurm
        self.clock = clock
        self.job_id = env.job_id or ""
        self.journal = Journal(paths.journal, clock=clock)
        self.inbox = SignalInbox()
        self.detector = Detector(DetectConfig.from_mapping(config.detect))
        self.policy = policy.PolicyConfig.from_mapping(config.policy)
        self.ledger_config = LedgerConfig.from_mapping(config.ledger)
        self.signatures = signatures_from_table(config.log_signatures)
        self.layout = launcher.Layout(
            nodes=env.nodelist, tasks_per_node=env.tasks_per_node[0] if env.tasks_per_node else 1,
            spare_nodes=config.run.spare_nodes,
        )  # fmt: skip
        self.server: AggregatorServer | None = None
        self.agents: subprocess.Popen[bytes] | None = None
        self.launches = 0
        self.history: list[dict[str, Any]] = []
        self.old_pids: set[int] = set()  # rank pids of earlier launches: their slots linger until overwritten
        self.quarantined: set[str] = set()
        self.best_step: int | None = None
        self.agents_started = 0.0
        self.scheduled_end: float | None = None
        self.last_finite_loss_step: int | None = None
        self.slot_token = secrets.token_hex(8)  # this Slurm run's slot directories get unguessable names

    # ----------------------------------------------------------------------------------------- journal
    def record(self, event: dict[str, Any]) -> None:
        self.journal.append(event)
        self.history.append(event)
        log.info(event["type"], **{k: v for k, v in event.items() if k not in ("type", "t", "v", "event")})

    # ----------------------------------------------------------------------------------------- lifecycle
    def run(self) -> int:
        from supervisor.journal import read

        self.history = read(self.paths.journal)
        for e in self.history:  # what earlier runs already journaled is not journaled again
            if e["type"] == TIMEOUTS_LEARNED:  # the last one wins: a requeued run keeps what was learned
                self.detector.timeouts.restore(e.get("histograms", {}))
            if e["type"] == "checkpoint_quarantined":
                self.quarantined.add(str(e.get("path")))
            elif e["type"] == ev.CHECKPOINT_COMMITTED and isinstance(e.get("step"), int):
                self.best_step = max(self.best_step or 0, e["step"])
        now = self.clock()
        if not any(e["type"] == ev.CAMPAIGN_STARTED for e in self.history):
            self.record(ev.campaign_started(now, str(self.paths.root), self.spec.command, self.job_id))
        for event in infer_previous_outcome(self.history, self._node_states(), self._job()):
            self.record(event)
        self.record(ev.attempt_started(now, self.job_id, self.env.restart_count, self.layout.nodes, None))
        job = self._job()
        self.scheduled_end = getattr(job, "end_time", None) or self.env.end_time
        try:
            self._start_channel()
            return self._attempt()
        finally:
            self._shutdown()

    def _start_channel(self) -> None:
        addrs = self._node_addrs()
        host = bind_address(os.environ.get(BIND_ENV), addrs.get(self.env.batch_host or ""))
        allowed = resolve_sources(addrs.get(n) for n in self.layout.nodes)
        self.server = AggregatorServer(self.paths.root, self.job_id, bind=(host, 0), allowed_sources=allowed)
        self.server.write_address_file()
        self._spawn_agents(self.layout.nodes)
        self._wait_for_agents()

    def _spawn_agents(self, nodes: tuple[str, ...]) -> None:
        assert self.server is not None
        argv = launcher.agent_argv(
            nodes, self.spec.python or "python3", self.paths.root, self.server.address,
            ["--sample-interval", str(self.config.run.agent_interval_s),
             "--report-interval", str(self.config.run.summary_interval_s)],
        )  # fmt: skip
        self.agents = launcher.start(argv, self._step_env(""), self._attempt_logs() / "agents.log", self.spec.cwd)
        self.agents_started = time.monotonic()

    def _wait_for_agents(self, timeout_s: float = AGENT_START_TIMEOUT_S) -> None:
        """Launch the training only once every node's agent reported: its slot directory must exist before
        the ranks look for it. A node whose agent stays silent is journaled; training goes on unwatched there."""
        assert self.server is not None and self.agents is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.agents.poll() is None:
            self.server.poll(0.1)
            if set(self.layout.nodes) <= set(self.server.table.nodes):
                return
        missing = sorted(set(self.layout.nodes) - set(self.server.table.nodes))
        self.record({"type": "agents_missing", "t": self.clock(), "nodes": missing,
                     "reason": "node agents did not report in time; ranks there run without heartbeats"})

    def _node_addrs(self) -> dict[str, str]:
        """NodeAddr of the batch host and the allocation's nodes (127.0.0.1 on the local cluster); a node
        missing from the answer is unknown (the bind address then fails clearly, the source filter is off)."""
        out: dict[str, str] = {}
        for names in ([self.env.batch_host] if self.env.batch_host else [], list(self.layout.nodes)):
            try:  # two queries: a problem with the allocation's list must not cost the bind address
                text = self.slurm.run(["scontrol", "show", "node", "-o", compress(names)]).stdout if names else ""
            except Exception:  # noqa: BLE001 - unknown, not empty: the callers decide what unknown means
                continue
            for line in text.splitlines():
                fields = dict(t.split("=", 1) for t in line.split() if "=" in t)
                if fields.get("NodeName") and fields.get("NodeAddr"):
                    out[fields["NodeName"]] = fields["NodeAddr"]
        return out

    def _shutdown(self) -> None:
        if self.server is not None:
            for node in self.layout.nodes:
                self.server.send(node, [wire.Command(wire.CMD_EXIT)])
        if self.agents is not None and self.agents.poll() is None:
            try:
                self.agents.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.agents.terminate()
                try:
                    self.agents.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    self.agents.kill()
        if self.server is not None:
            self.server.close()
        self.inbox.close()
        self.journal.close()

    # ----------------------------------------------------------------------------------------- attempt
    def _attempt(self) -> int:
        excluded = self._ledger_exclusions()
        while True:
            resume, resume_step = self._pick_resume()
            step = self._launch(resume, resume_step, excluded)
            ending = self._watch(step)
            self._journal_timeouts()
            ledger = Ledger.fold(self.history, self.ledger_config)
            interruption, decision = respond(
                ending, self.history, self.layout.nodes, self.layout.train_nodes, self.policy, ledger,
                step_running=step.proc.poll() is None, restarts_here=self.launches - 1,
                signatures=self.signatures, slurm_kills_on_node_failure=not self._no_kill(),
            )  # fmt: skip
            self.record({**interruption.to_event(self.clock()), "launch": step.launch,
                         "last_step": last_step(ending)})
            outcome = self._carry_out(decision, interruption, step, ending)
            if interruption.cls == ev.NUMERICAL:  # the step is gone now: no checkpoint can appear after this
                self._quarantine_after_divergence()
            if outcome is not None:
                return outcome
            excluded = self._next_exclusions(decision)

    def _no_kill(self) -> bool:
        """Whether Slurm keeps this job alive when one of its nodes fails (``--no-kill``, set for spare nodes)."""
        from slurm.sbatch import has_option

        return has_option(self.spec.sbatch_flags, "--no-kill", "-k")

    def _attempt_logs(self) -> Path:
        return self.paths.attempt_logs(self.job_id, self.env.restart_count)

    def _step_env(self, resume: str | None) -> dict[str, str]:
        env = dict(os.environ)
        env["SUPERVISOR_CAMPAIGN"] = str(self.paths.root)
        env[SLOT_DIR_ENV] = slot_dir_template(self.job_id, self.slot_token)
        if resume is None and not self.config.run.checkpoint_dir:
            env.pop("SUPERVISOR_RESUME_FROM", None)  # unknown, not "fresh start" (""): the program looks itself
        else:
            env["SUPERVISOR_RESUME_FROM"] = resume or ""
        return env

    def _store(self) -> Any:
        ckpt_dir = self.config.run.checkpoint_dir
        if not ckpt_dir or not Path(ckpt_dir).is_dir():
            return None
        from supervisor.checkpoint.store import CheckpointStore
        from supervisor.checkpoint.trust import campaign_key

        return CheckpointStore(ckpt_dir, key=campaign_key(self.paths.root),
                               adopt_foreign=self.config.run.adopt_foreign_checkpoints)

    def _pick_resume(self) -> tuple[str | None, int | None]:
        """The newest valid checkpoint (torn or corrupt ones are quarantined on the way), or a fresh start."""
        store = self._store()
        if store is None:
            return None, None
        newest = store.newest_valid(full=False, quarantine=True)
        for info in store.refused:  # foreign checkpoints refused from a root others can write: say why, once
            if str(info.path) not in self.quarantined:
                self.quarantined.add(str(info.path))
                self.record({"type": "checkpoint_refused", "t": self.clock(), "path": str(info.path),
                             "reason": info.reason[:500]})
        for moved in store.quarantined():
            if str(moved.path) not in self.quarantined:
                self.quarantined.add(str(moved.path))
                self.record({"type": "checkpoint_quarantined", "t": self.clock(), "path": str(moved.path),
                             "reason": moved.reason[:500]})
        if newest is None:
            return None, None
        self._note_checkpoint(newest)
        return str(newest.path), newest.step

    def _quarantine_after_divergence(self) -> None:
        """After a NaN/Inf loss, checkpoints newer than the last step seen with a finite loss may hold the
        diverged weights: move them aside so no later run resumes from them (never deleted)."""
        store = self._store()
        if store is None:
            return
        since = self.last_finite_loss_step or 0
        for info in store.list():
            if info.step is not None and info.step > since and info.status in ("valid", "unverified"):
                reason = f"saved at step {info.step}, after the last finite loss seen (step {since}) and before " \
                         "the NaN/Inf loss was detected: may hold diverged weights"
                moved = store.quarantine(info.path, reason)
                self.quarantined.add(str(moved))
                self.record({"type": "checkpoint_quarantined", "t": self.clock(), "path": str(moved), "reason": reason})

    def _note_checkpoint(self, info: Any) -> None:
        """Journal a newly seen valid checkpoint: it is the campaign's progress (budgets, lost work)."""
        if info is None or info.step is None or (self.best_step is not None and info.step <= self.best_step):
            return
        self.best_step = info.step
        self.record(ev.checkpoint_committed(self.clock(), info.step, str(info.path)))

    def _scan_checkpoints(self) -> None:
        store = self._store()
        if store is not None:
            try:
                self._note_checkpoint(store.newest_valid(full=False, quarantine=False))
            except OSError as err:
                log.warning("checkpoint_scan_failed", error=str(err))

    def _launch(self, resume: str | None, resume_step: int | None, excluded: tuple[str, ...]) -> Step:
        self.launches += 1
        name = f"train-{self.launches}"
        argv = launcher.train_argv(self.layout, self.spec.command, self.launches, excluded,
                                   self.config.run.srun_args)
        log_path = self._attempt_logs() / f"train-{self.launches}.log"
        nodes = tuple(n for n in self.layout.nodes if n not in excluded)[: self.layout.train_nodes]
        self.record({**ev.step_launched(self.clock(), self.launches, nodes, excluded, resume),
                     "resume_step": resume_step})
        self.detector.new_launch()
        self.last_finite_loss_step = resume_step  # this launch's losses start after the checkpoint it resumes
        if self.server is not None:
            self.old_pids.update(r.pid for r in self.server.table.snapshot().ranks)
        proc = launcher.start(argv, self._step_env(resume), log_path, self.spec.cwd)
        return Step(self.launches, name, proc, log_path, time.monotonic(), nodes)

    # ----------------------------------------------------------------------------------------- watching
    def _watch(self, step: Step) -> StepEnding:
        """Watch until the step exits, a fault is detected, or a signal asks us to act."""
        assert self.server is not None
        next_eval = next_scan = next_timeouts = 0.0
        exited_since: float | None = None  # a rank exited while srun still runs: normal at the very end
        pending: list[DetectionEvent] = []
        while True:
            self.server.poll(0.1)
            received = self.inbox.drain()
            if received:
                return self._ending(step, "signal", signals=received, detections=pending)
            code = step.proc.poll()
            if code is not None:
                # Give the agents a moment to report how each rank ended (exit codes, signals).
                self._settle(0.6)
                self._scan_checkpoints()
                found = self._verdict_on_silent_nodes(step) if code != 0 else []
                return self._ending(step, "exited", exit_code=code, detections=pending + found)
            now = time.monotonic()
            if now >= next_scan:
                next_scan = now + CHECKPOINT_SCAN_S
                self._scan_checkpoints()
            if now >= next_timeouts:
                if next_timeouts:
                    self._journal_timeouts()
                next_timeouts = now + TIMEOUTS_JOURNAL_S
            if now < next_eval:
                continue
            next_eval = now + self.config.run.loop_interval_s
            for d in self._observe(step):
                if not d.is_fault:
                    self.record(ev.detection_event(d, self.clock()))
                elif d.kind == RANK_EXITED:
                    # Ranks finish one by one; srun (--kill-on-bad-exit) ends the step at once on a crash.
                    # Only a rank gone while srun keeps running past the grace time is a fault by itself.
                    pending.append(d)
                    exited_since = exited_since or now
                else:
                    return self._ending(step, "detection", detections=pending + [d])
            if exited_since is not None and now - exited_since > EXIT_GRACE_S:
                return self._ending(step, "detection", detections=pending + self._verdict_on_silent_nodes(step))
            if self.agents is not None and self.agents.poll() is not None:
                self._restart_agents(step)

    def _verdict_on_silent_nodes(self, step: Step) -> list[DetectionEvent]:
        """A crash seen from the survivors (gloo errors, exits) often means a node died: while some node's
        agent has gone quiet, wait until the detectors call it silent (or it speaks again), so the dead node,
        not the network, takes the blame."""
        assert self.server is not None
        hang = self.detector.config.hang
        deadline = time.monotonic() + hang.node_silence_s + 1.0
        found: list[DetectionEvent] = []
        while time.monotonic() < deadline:
            found += [d for d in self._observe(step) if d.is_fault]
            views = self.server.table.node_views()
            stale = [n for n in step.nodes if n not in views or views[n].staleness_s > hang.node_stale_s]
            if not stale or any(d.kind == NODE_SILENT for d in found):
                break
            self._settle(0.5)
        return found

    def _restart_agents(self, step: Step) -> None:
        """The agents' step died (a node failed under it): start it again on the nodes Slurm still has up."""
        assert self.server is not None
        now = time.monotonic()
        if now - self.agents_started < AGENT_RESTART_MIN_S:
            return
        states = self._node_states()
        nodes = tuple(n for n in self.layout.nodes if states.get(n, "up") == "up")
        self.record({"type": "agents_restarted", "t": self.clock(), "nodes": list(nodes)})
        self._spawn_agents(nodes)

    def _journal_timeouts(self) -> None:
        learned = self.detector.timeouts.to_dict()
        if learned:
            self.record({"type": TIMEOUTS_LEARNED, "t": self.clock(), "histograms": learned,
                         "timeouts_s": self.detector.timeouts.learned()})

    def _settle(self, seconds: float) -> None:
        assert self.server is not None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.server.poll(0.05)

    def _live(self, step: Step) -> Any:
        """The aggregator's snapshot of the step's nodes, without the ranks of earlier launches."""
        assert self.server is not None
        live = self.server.table.snapshot()
        nodes = set(step.nodes)
        return dataclasses.replace(
            live, nodes={n: v for n, v in live.nodes.items() if n in nodes},
            ranks=[r for r in live.ranks if r.pid not in self.old_pids and r.node in nodes],
        )  # fmt: skip

    def _observe(self, step: Step) -> list[DetectionEvent]:
        live = self._live(step)
        finite = [r.loss_step for r in live.ranks if r.loss is not None and math.isfinite(r.loss)]
        if finite:  # the newest step known to have a finite loss: later checkpoints are suspect after a NaN
            self.last_finite_loss_step = max(self.last_finite_loss_step or 0, max(finite))
        snap = snapshot_from_live(live, launch_age_s=time.monotonic() - step.started)
        return self.detector.observe(snap, self.clock())

    def _ending(self, step: Step, reason: str, *, exit_code: int | None = None,
                detections: list[DetectionEvent] | None = None, signals: list[Received] | None = None) -> StepEnding:
        """Gather the evidence about how the step ended (or must end): Slurm's view, the ranks', the log's."""
        assert self.server is not None
        for d in detections or []:
            self.record(ev.detection_event(d, self.clock()))
        ranks = self._live(step).ranks
        exits = tuple(
            RankExit(node=r.node, rank=r.rank, exit_code=r.exit_code, signal=r.exit_signal)
            for r in ranks if r.state in procstate.ENDED and (r.exit_code is not None or r.exit_signal)
        )  # fmt: skip
        hung: dict[str, set[int]] = {}
        for d in detections or []:
            if d.kind in HANG_KINDS:
                for r in ranks:
                    if r.rank in d.ranks:
                        hung.setdefault(r.node, set()).add(r.rank)
        return StepEnding(
            reason=reason, launch=step.launch, exit_code=exit_code, detections=tuple(detections or ()),
            signals=tuple(s.name for s in signals or ()), signal_times=tuple(s.at for s in signals or ()),
            job=self._job(), nodes=self._node_states(), log_tail=tuple(_tail(step.log_path)), step_nodes=step.nodes,
            last_steps={r.rank: r.step for r in ranks}, now=self.clock(), rank_exits=exits,
            sigterm_ranks=tuple(r.rank for r in ranks if r.rank_flags & slot_flag("RANK_FLAG_SIGTERM")),
            hung={n: tuple(sorted(v)) for n, v in hung.items()}, signal_lead_s=float(self.config.submit.signal_lead_s),
            scheduled_end=self.scheduled_end,
        )  # fmt: skip

    def _job(self) -> Any:
        try:
            return self.slurm.job(self.job_id)
        except Exception as err:  # noqa: BLE001 - evidence gathering must never stop the response
            log.warning("slurm_query_failed", error=str(err))
            return None

    def _node_states(self) -> dict[str, str]:
        try:
            return {n.name: ("down" if n.is_down else "drain" if n.is_drain else "up")
                    for n in self.slurm.nodes(self.layout.nodes or None)}
        except Exception as err:  # noqa: BLE001
            log.warning("slurm_nodes_failed", error=str(err))
            return {}

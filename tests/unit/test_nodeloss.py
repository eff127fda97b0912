"""Our own node-loss verdict: the pure judge (learned timeout, probe confirmation, "everyone silent" is ours,
the batch host is never blamed), the probe's srun line and result, and the loop with a node that goes
silent while its peers look hung: the node's loss wins over the hang."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeChannel, FakeInbox, FakeLauncher, FakeSlurm, FakeTable, Launch

from slurm import probe
from slurm.env import SlurmEnv
from slurm.model import JobInfo
from supervisor.campaign import CampaignPaths, CampaignSpec
from supervisor.config import Config, RunConfig
from supervisor.decisions import events as ev
from supervisor.decisions import nodeloss as nl
from supervisor.decisions.classify import Evidence, classify
from supervisor.decisions.detect import NODE_LOST, DetectConfig, DetectionEvent
from supervisor.driver.compose import Attempt
from supervisor.driver.context import Context
from supervisor.heartbeat.table import NodeView
from supervisor.journal import read

NODES3 = ("n1", "n2", "n3")


def judge(**config: Any) -> nl.NodeLossJudge:
    return nl.NodeLossJudge(nl.NodeLossConfig(**config), beat_interval_s=1.0)


# ------------------------------------------------------------------------------------------- the pure judge


def test_the_timeout_is_learned_from_the_beat_interval_and_bounded() -> None:
    assert judge().timeout_s == 3.0  # 3 beats of 1 s
    assert nl.NodeLossJudge(beat_interval_s=0.1).timeout_s == 2.0  # the floor
    assert nl.NodeLossJudge(beat_interval_s=10.0).timeout_s == 5.0  # never later than the cap (default 5 s)
    j = judge()
    for staleness in (0.2, 1.6, 0.1):  # a summary arrived after a 1.6 s gap: beats are slower than configured
        j.learn({"n1": staleness})
    assert j.beat_s == 1.6 and j.timeout_s == pytest.approx(4.8)


def test_a_quiet_node_is_probed_at_once_and_lost_when_silent_and_the_probe_failed() -> None:
    j = judge()
    quiet = j.judge(0.0, {"n1": 0.1, "n2": 1.6, "n3": 0.2}, {"n2": [1.6]}, batch_host="n1")
    assert quiet.to_probe == ("n2",) and quiet.pending == ("n2",)  # a beat and a half late: probe; hangs wait
    assert j.judge(0.5, {"n1": 0.1, "n2": 2.1, "n3": 0.2}, {"n2": [2.1]}).to_probe == ()  # one probe at a time
    assert j.probe_result("n2", False, 1.0, 2.6, "no answer within 3.0s") is None  # failed, not yet silent
    silent = j.judge(1.5, {"n1": 0.1, "n2": 3.1, "n3": 0.2}, {"n2": [3.1]}, batch_host="n1")
    (verdict,) = silent.verdicts
    assert verdict.verdict == nl.LOST and verdict.confirmed_by == nl.BY_PROBE and "no answer" in verdict.detail
    event = verdict.to_event(100.0)
    assert event["type"] == ev.NODE_LOSS_VERDICT and event["nodes"] == ["n2"] and event["timeout_s"] == 3.0
    after = j.judge(3.0, {"n1": 0.1, "n2": 6.0, "n3": 0.2}, {}, batch_host="n1")
    assert after == nl.Judgement()  # a lost node is no longer watched


def test_a_probe_failing_after_the_timeout_gives_the_verdict_at_once() -> None:
    j = judge()
    assert j.judge(0.0, {"n1": 0.1, "n2": 1.6}, {}).to_probe == ("n2",)
    verdict = j.probe_result("n2", False, 3.0, 4.6, "srun exited 1: Communication connection failure")
    assert verdict is not None and verdict.verdict == nl.LOST and "Communication" in verdict.evidence


def test_a_rank_still_beating_keeps_its_node_from_being_lost() -> None:
    j = judge()
    assert j.judge(0.0, {"n1": 0.1, "n2": 3.5}, {"n2": [0.5, 9.0]}).to_probe == ("n2",)
    assert j.probe_result("n2", False, 0.5, 4.0, "no answer", ranks_silent=False) is None
    assert j.judge(1.0, {"n1": 0.1, "n2": 4.5}, {"n2": [0.5, 9.0]}).verdicts == ()
    (verdict,) = j.judge(1.1, {"n1": 0.1, "n2": 4.6}, {"n2": [None, 9.0]}).verdicts  # no client: says nothing
    assert verdict.verdict == nl.LOST


def test_a_probe_that_gets_through_clears_the_node_until_reprobe_time() -> None:
    j = judge(reprobe_s=10.0)
    assert j.judge(0.0, {"n1": 0.1, "n2": 3.5}, {}).to_probe == ("n2",)
    verdict = j.probe_result("n2", True, 0.5, 3.5)
    assert verdict is not None and verdict.verdict == nl.ALIVE
    later = j.judge(5.0, {"n1": 0.1, "n2": 8.5}, {})
    assert later.to_probe == () and later.pending == ()  # alive: a hang there may be reported
    assert j.judge(11.0, {"n1": 0.1, "n2": 14.5}, {}).to_probe == ("n2",)


def test_slurm_not_responding_confirms_without_a_probe() -> None:
    found = judge().judge(0.0, {"n1": 0.1, "n2": 3.5}, {}, not_responding={"n2"})
    assert [v.verdict for v in found.verdicts] == [nl.LOST] and found.verdicts[0].confirmed_by == nl.BY_SLURM
    assert found.to_probe == ()


def test_every_node_silent_is_our_side_and_nobody_is_blamed_once() -> None:
    j = judge()
    first = j.judge(0.0, {"n1": 4.0, "n2": 3.5, "n3": 9.0}, {})
    assert [v.verdict for v in first.verdicts] == [nl.OURS] and first.to_probe == () and not j.state.lost
    assert "our side" in first.verdicts[0].evidence
    assert j.judge(1.0, {"n1": 5.0, "n2": 4.5, "n3": 10.0}, {}).verdicts == ()  # said once per episode


def test_the_batch_host_is_never_declared_lost_by_the_supervisor_running_on_it() -> None:
    found = judge().judge(0.0, {"n1": 9.0, "n2": 0.1}, {}, batch_host="n1", not_responding={"n1"})
    assert found == nl.Judgement()


def test_a_node_that_speaks_again_while_probed_gets_no_verdict() -> None:
    j = judge()
    j.judge(0.0, {"n1": 0.1, "n2": 3.5}, {})
    j.judge(0.5, {"n1": 0.1, "n2": 0.2}, {})
    assert j.probe_result("n2", False, 1.0, 3.5) is None and not j.state.failed


def test_bad_config_names_the_setting() -> None:
    with pytest.raises(ValueError, match="floor_s"):
        nl.NodeLossConfig(floor_s=6.0, cap_s=5.0)
    with pytest.raises(ValueError, match="probe_timeout_s"):
        nl.NodeLossConfig(probe_timeout_s=0)


def test_a_confirmed_loss_classifies_as_node_failure_blaming_the_node() -> None:
    lost = DetectionEvent(NODE_LOST, (), ("n2",), "summary_age_s", 3.5, 3.0, 3.5, ("node n2 lost",))
    i = classify(Evidence(job_state="RUNNING", node_states={"n1": "UP", "n2": "UP"}, allocation_nodes=("n1", "n2"),
                          detections=((1.0, lost),)))  # fmt: skip
    assert i.cls == ev.NODE_FAILURE and i.blamed_nodes == ("n2",) and i.confidence >= 0.9


# ------------------------------------------------------------------------------------------- the probe


class FakeProc:
    def __init__(self, code: int | None) -> None:
        self.returncode = code
        self.killed = False

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.killed = True
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode if self.returncode is not None else 0


def test_probe_results() -> None:
    assert probe.Probe("n2", FakeProc(0), 0.0, 3.0).result(0.5) == (True, "srun true answered")
    alive, detail = probe.Probe("n2", FakeProc(1), 0.0, 3.0).result(0.5) or (None, "")
    assert alive is False and detail.startswith("srun exited 1")
    running = FakeProc(None)
    assert probe.Probe("n2", running, 0.0, 3.0).result(1.0) is None
    assert probe.Probe("n2", running, 0.0, 3.0).result(3.5) == (False, "no answer within 3.0s") and running.killed


# ------------------------------------------------------------------------------------------- the loop


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


class SilentNodeTable(FakeTable):
    """A table whose node ``silent`` stops reporting ``after_s`` after the launch starts; its peers' ranks stop
    beating at the same time (stuck in a collective with the dead node)."""

    def __init__(self, job: str, silent: str, after_s: float) -> None:
        super().__init__(job)
        self.silent, self.after_s, self.t0 = silent, after_s, 0.0
        self.stalled = True  # the first launch's peers stall with the node; later launches run fine

    def _age(self) -> float:
        return max(0.0, time.monotonic() - self.t0 - self.after_s) if self.t0 else 0.0

    def node_views(self, nodes: Any = None) -> dict[str, NodeView]:
        return {n: NodeView(n, self._age() if n == self.silent else 0.0, 1, 1, 1, 0.0, "127.0.0.1:1")
                for n in self.nodes}  # fmt: skip

    def snapshot(self) -> Any:
        snap = super().snapshot()
        age = self._age()
        # The silent node's ranks are heard of no more; in the first launch their peers stall with them.
        return replace(snap, ranks=[r._replace(beat_age_s=0.1 + age) if self.stalled or r.node == self.silent else r
                                    for r in snap.ranks])  # fmt: skip


@dataclass
class DeadProbe:
    started: list[str]

    def __call__(self, node: str, timeout_s: float) -> probe.Probe:
        self.started.append(node)
        return probe.Probe(node, FakeProc(1), time.monotonic(), timeout_s)


def supervise_with_silent_node(tmp_path: Path, spare_nodes: int, sbatch_flags: tuple[str, ...] = ()) -> tuple[
        int, list[dict[str, Any]], FakeSlurm, list[str]]:  # fmt: skip
    root = tmp_path / "campaign"
    root.mkdir()
    spec = CampaignSpec(command=("python", "train.py"), sbatch_flags=sbatch_flags, python="python3")
    env = SlurmEnv(job_id="7", nodelist=NODES3, tasks_per_node=(1,), restart_count=0, node_name="n1")
    channel = FakeChannel("7")
    table = SilentNodeTable("7", "n2", after_s=0.3)
    channel.table = table
    job = JobInfo(job_id="7", state="RUNNING", base_state="RUNNING", nodes=NODES3, batch_host="n1",
                  end_time=int(time.time()) + 3600)  # fmt: skip
    slurm = FakeSlurm(job, NODES3, channel)
    launcher = FakeLauncher(channel, NODES3, 1, [Launch(exit_code=None), Launch(exit_code=0, polls=3)])
    probes = DeadProbe([])
    config = Config(run=RunConfig(spare_nodes=spare_nodes, loop_interval_s=0.05),
                    detect=DetectConfig.from_mapping({"warmup_timeout_s": 2.0, "init_allowance_s": 2.0}))  # fmt: skip
    sup = Attempt(CampaignPaths(root), spec, config, env, slurm,  # type: ignore[arg-type]
                     channel_factory=lambda *_: channel, start_step=launcher, inbox=FakeInbox(),  # type: ignore[arg-type]
                     start_probe=probes)  # fmt: skip
    original = launcher.__call__

    def start(argv: Any, env: Any, log_path: Path, cwd: Any = None) -> Any:
        proc = original(argv, env, log_path, cwd)
        if any(a.startswith("--job-name=train-") for a in argv):  # a training launch (not agents, preflight)
            table.stalled = not table.t0
            table.t0 = table.t0 or time.monotonic()
        return proc

    sup.start_step = start
    code = sup.run()
    return code, read(root / "journal.jsonl"), slurm, probes.started


def test_a_lost_node_wins_over_the_hang_of_its_peers_and_a_spare_replaces_it(tmp_path: Path) -> None:
    code, events, slurm, probed = supervise_with_silent_node(tmp_path, spare_nodes=1, sbatch_flags=("--no-kill",))
    verdicts = [e for e in events if e["type"] == ev.NODE_LOSS_VERDICT]
    assert probed == ["n2"] and [(v["verdict"], v["nodes"]) for v in verdicts] == [("lost", ["n2"])]
    first = next(e for e in events if e["type"] == ev.INTERRUPTION)
    assert first["class"] == ev.NODE_FAILURE and first["blamed_nodes"] == ["n2"]
    relaunch = [e for e in events if e["type"] == ev.STEP_LAUNCHED][1]
    assert "n2" not in relaunch["nodes"] and "n2" in relaunch["excluded"]
    assert not any(c[0] == "requeue" for c in slurm.calls) and code == 0


def test_without_a_spare_a_lost_node_requeues_at_once_excluding_it(tmp_path: Path) -> None:
    code, events, slurm, _ = supervise_with_silent_node(tmp_path, spare_nodes=0)
    first = next(e for e in events if e["type"] == ev.INTERRUPTION)
    assert first["class"] == ev.NODE_FAILURE and first["blamed_nodes"] == ["n2"]
    job_calls = [c for c in slurm.calls if c[0] != "cancel_step"]
    # Expedited: the lost node leaves the allocation first (the job completes without waiting for Slurm to mark
    # it DOWN), then the requeue and the exclusion, then a StartTime just ahead (not cred_expire + 1 s).
    assert job_calls == [("shrink_job", "7", ["n1", "n3"]), ("requeue", "7"),
                         ("update_excluded_nodes", "7", ["n2"]), ("set_start_time", "7", 5)] and code == 0
    expedited = next(e for e in events if e["type"] == ev.REQUEUE_EXPEDITED)
    assert expedited["dropped"] == ["n2"] and expedited["start_in_s"] == 5 and expedited["errors"] == []


def requeue_actions(job: JobInfo, slurm: Any) -> tuple[Any, list[dict[str, Any]]]:
    from supervisor.driver.requeue import JobActions

    events: list[dict[str, Any]] = []
    actions = JobActions(Context.of(events.append), slurm=slurm, channel=FakeChannel("7"), inbox=FakeInbox(),  # type: ignore[arg-type]
                         job_id="7", restart_count=0, scheduled_end=lambda: None)  # fmt: skip
    return actions, events


def test_an_expedited_requeue_never_drops_the_batch_host_and_goes_on_when_slurm_refuses(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import signal as signal_module

    from slurm.errors import SlurmCommandError

    monkeypatch.setattr(signal_module, "signal", lambda *_: None)  # (JobActions ignores SIGTERM while it works)
    job = JobInfo(job_id="7", state="RUNNING", base_state="RUNNING", nodes=NODES3, batch_host="n1")
    slurm = FakeSlurm(job, NODES3, FakeChannel("7"))
    actions, events = requeue_actions(job, slurm)
    actions.requeue(("n1",), lost=("n1",))  # the batch host: Slurm would refuse, and nothing would supervise
    assert [c[0] for c in slurm.calls] == ["requeue", "update_excluded_nodes", "set_start_time"]
    assert events[-1]["dropped"] == []

    class Refusing(FakeSlurm):
        def shrink_job(self, job_id: Any, nodes: Any) -> None:
            raise SlurmCommandError(["scontrol"], 1, "Requested operation not supported on this job")

        def set_start_time(self, job_id: Any, delay_s: int) -> None:
            raise SlurmCommandError(["scontrol"], 1, "Job is no longer pending execution")

    slurm = Refusing(job, NODES3, FakeChannel("7"))
    actions, events = requeue_actions(job, slurm)
    actions.requeue(("n2",), lost=("n2",))
    assert [c[0] for c in slurm.calls] == ["requeue", "update_excluded_nodes"]  # the requeue happens regardless
    done = events[-1]
    assert done["type"] == ev.REQUEUE_EXPEDITED and done["dropped"] == [] and done["start_in_s"] is None
    assert len(done["errors"]) == 2 and "shrink to n1,n3" in done["errors"][0] and "StartTime" in done["errors"][1]

    # Without slurmdbd a resized job refuses updates until it completes: the exclusion comes first, no shrink.
    slurm = FakeSlurm(job, NODES3, FakeChannel("7"))
    slurm.accounting = "accounting_storage/none"
    actions, events = requeue_actions(job, slurm)
    actions.requeue(("n2",), lost=("n2",))
    assert [c[0] for c in slurm.calls] == ["requeue", "update_excluded_nodes", "set_start_time"]
    assert events[-1]["dropped"] == [] and "not shrunk: AccountingStorageType is accounting_storage/none" in \
        events[-1]["errors"][0]


# ------------------------------------------------------------------------------------------- the policy


def test_spares_used_up_go_on_with_fewer_nodes_only_when_min_nodes_allows() -> None:
    from supervisor.decisions.classify import Interruption
    from supervisor.decisions.policy import REQUEUE, RESTART_IN_ALLOCATION, Allocation, History, decide

    lost = Interruption(ev.NODE_FAILURE, ("n2",), 0.9, ("node n2 lost",))
    alloc = Allocation(nodes=NODES3, needed=3)
    assert decide(lost, History(), alloc).actions[-1].kind == REQUEUE
    fewer = decide(lost, History(), replace(alloc, min_needed=2)).actions[-1]
    assert fewer.kind == RESTART_IN_ALLOCATION and fewer.params["fewer_nodes"] and fewer.params["nodes"] == ["n1", "n3"]
    assert decide(lost, History(), replace(alloc, min_needed=3)).actions[-1].kind == REQUEUE
    spare = decide(lost, History(), Allocation(nodes=NODES3, needed=2)).actions[-1]
    assert spare.kind == RESTART_IN_ALLOCATION and "fewer_nodes" not in spare.params


def test_a_job_that_cannot_outlive_the_node_is_requeued_at_once_even_with_a_spare() -> None:
    from supervisor.decisions.classify import Interruption
    from supervisor.decisions.policy import REQUEUE, Allocation, History, decide

    lost = Interruption(ev.NODE_FAILURE, ("n2",), 0.9, ("node n2 lost",))
    action = decide(lost, History(), Allocation(nodes=NODES3, needed=2, node_loss_ends_job=True)).actions[-1]
    assert action.kind == REQUEUE and action.params["exclude"] == ["n2"]

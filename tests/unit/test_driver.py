"""The supervisor loop and its actuators driven without Slurm: a fake Slurm client, heartbeat channel, step
launcher and signal inbox (tests/unit/fakes.py) around the real supervision loop (``driver.compose.Attempt``). One test per interruption class
asserts what the journal records (class, blame, actions) and what was asked of Slurm."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeChannel, FakeInbox, FakeLauncher, FakeSlurm, Launch

from slurm.env import SlurmEnv
from slurm.model import JobInfo, NodeInfo
from supervisor.campaign import CampaignPaths, CampaignSpec
from supervisor.config import Config
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.driver.actuators import Actuators
from supervisor.driver.compose import Attempt, node_addresses
from supervisor.driver.context import Context
from supervisor.heartbeat.server import ChannelError, bind_address
from supervisor.journal import read

NODES = ("n1", "n2")
JOB = "7"
TRACEBACK = "0: Traceback (most recent call last):\n0:   File \"train.py\", line 3\n0: ValueError: boom\n"


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    """The requeue actuators ignore SIGTERM (Slurm's KillWait is their time); give pytest its handler back."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@dataclass
class Run:
    code: int
    events: list[dict[str, Any]]
    slurm: FakeSlurm
    launcher: FakeLauncher
    channel: FakeChannel

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == kind]

    def classes(self) -> list[str]:
        return [e["class"] for e in self.of(ev.INTERRUPTION)]

    def actions(self) -> list[str]:
        return [e["kind"] for e in self.of(ev.ACTION)]


def make(tmp_path: Path, launches: Sequence[Launch], sbatch_flags: Sequence[str] = ()
         ) -> tuple[Attempt, FakeSlurm, FakeLauncher, FakeChannel, FakeInbox]:  # fmt: skip
    root = tmp_path / "campaign"
    root.mkdir(exist_ok=True)
    paths = CampaignPaths(root)
    spec = CampaignSpec(command=("python", "train.py"), sbatch_flags=tuple(sbatch_flags), python="python3")
    env = SlurmEnv(job_id=JOB, nodelist=NODES, tasks_per_node=(1,), restart_count=0, node_name="n1")
    channel = FakeChannel(JOB)
    job = JobInfo(job_id=JOB, state="RUNNING", base_state="RUNNING", nodes=NODES, batch_host="n1",
                  end_time=int(time.time()) + 3600)  # fmt: skip
    slurm = FakeSlurm(job, NODES, channel)
    launcher = FakeLauncher(channel, NODES, 1, launches)
    inbox = FakeInbox()
    sup = Attempt(paths, spec, Config(), env, slurm, channel_factory=lambda root, job, bind, allowed: channel,
                     start_step=launcher, inbox=inbox)  # type: ignore[arg-type]  # fmt: skip
    return sup, slurm, launcher, channel, inbox


def run(sup: Attempt, slurm: FakeSlurm, launcher: FakeLauncher, channel: FakeChannel) -> Run:
    code = sup.run()
    return Run(code, read(sup.paths.journal), slurm, launcher, channel)


def supervise(tmp_path: Path, *launches: Launch) -> Run:
    sup, slurm, launcher, channel, _ = make(tmp_path, launches)
    return run(sup, slurm, launcher, channel)


# ------------------------------------------------------------------------------------------- per class


def test_a_clean_exit_completes_the_campaign(tmp_path: Path) -> None:
    r = supervise(tmp_path, Launch(0, ranks={"state": "exited", "exit_code": 0}))
    assert r.code == 0
    assert r.classes() == [ev.COMPLETED]
    assert r.of(ev.CAMPAIGN_ENDED)[-1]["state"] == "completed"
    assert [e["type"] for e in r.events[:4]] == [ev.CAMPAIGN_STARTED, ev.ATTEMPT_STARTED, ev.PREFLIGHT,
                                                 ev.STEP_LAUNCHED]  # fmt: skip


def test_an_app_error_is_relaunched_in_the_allocation_and_blames_nobody(tmp_path: Path) -> None:
    r = supervise(tmp_path, Launch(1, log=TRACEBACK), Launch(0, ranks={"state": "exited", "exit_code": 0}))
    assert r.code == 0
    assert r.classes() == [ev.APP_ERROR, ev.COMPLETED]
    assert r.of(ev.INTERRUPTION)[0]["blamed_nodes"] == []
    assert policy.RESTART_IN_ALLOCATION in r.actions()
    assert [e["launch"] for e in r.of(ev.STEP_LAUNCHED)] == [1, 2]
    assert not [c for c in r.slurm.calls if c[0] in ("requeue", "update_excluded_nodes")]


def test_a_hardware_line_is_classified_hardware(tmp_path: Path) -> None:
    r = supervise(tmp_path, Launch(1, log="NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus\n"),
                  Launch(0, ranks={"state": "exited", "exit_code": 0}))  # fmt: skip
    assert r.classes()[0] == ev.HARDWARE
    assert r.code == 0


def test_a_hung_rank_gets_its_stacks_saved_and_the_job_step_killed_then_relaunched(tmp_path: Path) -> None:
    hung = Launch(None, ranks={"phase": "init", "step": 0, "beat_age_s": 5000.0, "beats": 1})
    r = supervise(tmp_path, hung, Launch(0, ranks={"state": "exited", "exit_code": 0}))
    assert r.classes() == [ev.HANG, ev.COMPLETED]
    actions = r.actions()
    assert actions.index(policy.DUMP_STACKS) < actions.index(policy.KILL_STEP) < actions.index(
        policy.RESTART_IN_ALLOCATION)
    assert any(s["result"] == "stacks_saved" for s in r.of(ev.STACKS))
    assert ("cancel_step", f"{JOB}.1", "KILL") in r.slurm.calls  # the job step killed through the Slurm client
    assert {d["kind"] for d in r.of(ev.DETECTION)} & {"rank_hang", "global_stall"}


def test_a_nonfinite_loss_rolls_back_skipping_its_batches_then_stops_without_a_checkpoint(tmp_path: Path) -> None:
    """NaN: the launch is stopped without a checkpoint of the diverged state and relaunched as a roll back whose
    ranks are told which steps' batches to skip (``SUPERVISOR_SKIP_STEPS``: from the resumed step to the step the
    diverged launch reached); after the budget's two roll backs without progress, the campaign stops."""
    nan = Launch(None, ranks={"loss": float("nan"), "loss_step": 12, "step": 14}, stops_on_flags=False)
    sup, slurm, launcher, channel, _ = make(tmp_path, [nan, nan, nan])
    r = run(sup, slurm, launcher, channel)
    assert r.code == 1
    assert r.classes() == [ev.NUMERICAL] * 3
    assert r.of(ev.CAMPAIGN_ENDED)[-1]["state"] == "failed"
    assert not r.of(ev.CHECKPOINT_REQUESTED)  # a diverged state must not overwrite good checkpoints
    trains = [env for argv, env in zip(launcher.argvs, launcher.envs, strict=True) if "train.py" in argv]
    assert "SUPERVISOR_SKIP_STEPS" not in trains[0]
    assert [env.get("SUPERVISOR_SKIP_STEPS") for env in trains[1:]] == ["1-14", "1-14"]  # no checkpoint: from 1
    assert [e.get("skip_steps") for e in r.of(ev.STEP_LAUNCHED)] == [None, [1, 14], [1, 14]]
    assert [a["params"].get("rollback") for a in r.of(ev.ACTION) if a["kind"] == policy.RESTART_IN_ALLOCATION] \
        == [True, True]  # fmt: skip


def test_a_node_down_in_slurm_is_blamed_and_excluded_when_slurm_requeues(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(1, log="1: gloo: Connection reset by peer\n")])
    slurm.set_node("n2", "DOWN", "NOT_RESPONDING")
    slurm.set_job(flags=frozenset({"COMPLETING"}))
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0
    assert r.classes() == [ev.NODE_FAILURE]
    assert r.of(ev.INTERRUPTION)[0]["blamed_nodes"] == ["n2"]
    assert policy.AWAIT_REQUEUE in r.actions()
    assert ("update_excluded_nodes", JOB, ["n2"]) in slurm.calls
    assert r.of(ev.NODES_EXCLUDED)[-1]["nodes"] == ["n2"]
    assert r.of(ev.ATTEMPT_ENDED)[-1]["outcome"]["class"] == ev.NODE_FAILURE


def in_partition(slurm: FakeSlurm, nodes: Sequence[str], partition: str = "batch") -> None:
    """Slurm's records name each node's partition; the job runs in ``partition``."""
    for n in nodes:
        info = slurm.node_infos.get(n) or NodeInfo(name=n, state="IDLE")
        slurm.node_infos[n] = replace(info, partitions=(partition,))
    slurm.set_job(partition=partition)


def test_a_requeue_that_could_never_start_holds_the_job_and_says_why_in_one_line(tmp_path: Path, capsys) -> None:
    """Two nodes in the partition, the job needs both, one is down: Slurm would keep it pending for ever."""
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(1, log="1: gloo: Connection reset by peer\n")])
    slurm.set_node("n2", "DOWN", "NOT_RESPONDING")
    in_partition(slurm, NODES)
    slurm.set_job(flags=frozenset({"COMPLETING"}))
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0 and r.classes() == [ev.NODE_FAILURE]
    assert ("update_excluded_nodes", JOB, ["n2"]) in slurm.calls  # the broken node stays out...
    assert ("hold", JOB) in slurm.calls  # ...and the job waits for a person instead of for ever
    ended = r.of(ev.CAMPAIGN_ENDED)[-1]
    assert ended["state"] == "held"
    assert "needs 2 nodes and partition batch has 2" in ended["reason"] and "n2 (node_failure in this run)" in \
        ended["reason"] and "--forgive NODE" in ended["reason"] and f"scontrol release {JOB}" in ended["reason"]
    assert [e["tier"] for e in r.of(ev.ACTION) if e["kind"] == policy.ALERT][0] == "L2"
    assert ended["reason"] in capsys.readouterr().err  # the batch log says it too


def test_a_requeue_with_room_in_the_partition_is_not_held(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(1, log="1: gloo: Connection reset by peer\n")])
    slurm.set_node("n2", "DOWN", "NOT_RESPONDING")
    in_partition(slurm, (*NODES, "n3"))
    slurm.set_job(flags=frozenset({"COMPLETING"}))
    r = run(sup, slurm, launcher, channel)
    assert ("update_excluded_nodes", JOB, ["n2"]) in slurm.calls
    assert ("hold", JOB) not in slurm.calls and not r.of(ev.CAMPAIGN_ENDED)


def test_a_time_limit_checkpoints_then_requeues_without_blame(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, inbox = make(tmp_path, [Launch(None)])
    slurm.set_job(end_time=int(time.time()) + 60)
    inbox.deliver_after(3, "SIGUSR1")
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0
    assert r.classes() == [ev.TIMEOUT]
    assert r.of(ev.INTERRUPTION)[0]["blamed_nodes"] == []
    assert r.of(ev.CHECKPOINT_REQUESTED)  # the ranks were asked to save first
    assert ("requeue", JOB) in slurm.calls


def test_a_preemption_checkpoints_and_waits_for_slurms_requeue(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, inbox = make(tmp_path, [Launch(None)])
    slurm.set_job(preempt_time=int(time.time()), flags=frozenset({"COMPLETING"}))
    inbox.deliver_after(3, "SIGUSR1")
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0
    assert r.classes() == [ev.PREEMPTION]
    assert policy.AWAIT_REQUEUE in r.actions()
    assert not [c for c in slurm.calls if c[0] == "requeue"]  # Slurm requeues a preempted job itself


def test_a_cancel_stops_the_campaign_and_is_never_requeued(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, inbox = make(tmp_path, [Launch(143, polls=8)])
    slurm.set_job(base_state="CANCELLED", state="CANCELLED")
    inbox.deliver_after(3, "SIGTERM")
    r = run(sup, slurm, launcher, channel)
    assert r.code == 1
    assert r.classes() == [ev.CANCELLED]
    assert r.of(ev.CAMPAIGN_ENDED)[-1]["state"] == "stopped"
    assert not [c for c in slurm.calls if c[0] in ("requeue", "requeue_hold")]


def test_a_failed_slurm_query_is_unknown_evidence_not_a_healthy_answer(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SUPERVISOR_BIND", "127.0.0.1")  # (without it an unknown NodeAddr stops the run at once)
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(1, log=TRACEBACK),
                                                       Launch(0, ranks={"state": "exited", "exit_code": 0})])
    slurm.unreachable = True
    r = run(sup, slurm, launcher, channel)
    assert r.classes() == [ev.APP_ERROR, ev.COMPLETED]  # decided on what is known; nobody blamed
    assert r.of(ev.INTERRUPTION)[0]["blamed_nodes"] == []


def test_a_requeued_run_restores_learned_state_and_infers_the_lost_runs_end(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, ranks={"state": "exited", "exit_code": 0})])
    histograms = {"step": {"counts": {}, "n": 0}}
    with sup.recorder.journal as journal:  # a previous run that died with its batch host
        journal.append(ev.campaign_started(1.0, "/c", ["python", "train.py"], JOB))
        journal.append(ev.attempt_started(2.0, JOB, 0, NODES, None))
        journal.append(ev.timeouts_learned(3.0, histograms, {}))
    sup2, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, ranks={"state": "exited", "exit_code": 0})])
    slurm.set_node("n2", "DOWN")
    slurm.set_job(flags=frozenset({"COMPLETING"}))  # (this run too ends in Slurm's requeue: n2 is still down)
    r = run(sup2, slurm, launcher, channel)
    assert len(r.of(ev.CAMPAIGN_STARTED)) == 1  # not journaled twice
    inferred = r.of(ev.INTERRUPTION)[0]
    assert inferred["class"] == ev.NODE_FAILURE and inferred["blamed_nodes"] == ["n2"] and inferred["t"] == 3.0


# ------------------------------------------------------------------------------------------- composition


def test_every_policy_action_kind_has_an_actuator() -> None:
    kinds = {v for k, v in vars(policy).items() if k.isupper() and isinstance(v, str) and k not in ("_UNLIMITED",)}
    kinds -= {policy.STRAGGLER, policy.LOSS_SPIKE}  # detection kinds the policy imports, not action kinds
    kinds -= {"L1", "L2", "L3", "L4"}
    probe = Actuators(Context.of(print), slurm=None, channel=None, inbox=None, jobs=None,  # type: ignore[arg-type]
                      job_id=JOB, campaign="/c", alerts_config=Config().alerts, checkpoint_grace_s=1.0,
                      ranks_of=lambda step: [])  # fmt: skip
    assert kinds <= set(probe.table), f"no actuator for {sorted(kinds - set(probe.table))}"


def test_the_bind_address_is_the_override_else_the_nodes_address_never_every_interface() -> None:
    channel = FakeChannel(JOB)
    slurm = FakeSlurm(JobInfo(job_id=JOB, state="RUNNING"), NODES, channel)
    addrs = node_addresses(slurm, NODES, "n1")
    assert addrs == {"n1": "127.0.0.1", "n2": "127.0.0.1"}
    assert bind_address("10.0.0.5", addrs.get("n1")) == "10.0.0.5"
    assert bind_address(None, addrs.get("n1")) == "127.0.0.1"
    slurm.unreachable = True
    assert node_addresses(slurm, NODES, "n1") == {}  # unknown, not guessed
    with pytest.raises(ChannelError):
        bind_address(None, None)


def test_exclusions_are_not_written_when_the_current_list_cannot_be_read(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(1, log="1: gloo: Connection reset by peer\n")])
    slurm.set_node("n2", "DOWN", "NOT_RESPONDING")
    slurm.set_job(flags=frozenset({"COMPLETING"}), excluded_nodes=("n9",))
    original = slurm.job

    def job_then_unreachable(job_id: str | int) -> JobInfo | None:
        if sup.recorder.state.open_attempt is None and sup.recorder.state.attempts:  # the attempt has ended
            slurm.unreachable = True
        return original(job_id)

    slurm.job = job_then_unreachable  # type: ignore[method-assign]
    r = run(sup, slurm, launcher, channel)
    assert not [c for c in slurm.calls if c[0] == "update_excluded_nodes"]  # the user's n9 is never dropped
    assert r.of(ev.EXCLUSION_SKIPPED)[-1]["nodes"] == ["n2"]


def test_exclusions_keep_what_the_job_already_excludes(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(1, log="1: gloo: Connection reset by peer\n")])
    slurm.set_node("n2", "DOWN", "NOT_RESPONDING")
    slurm.set_job(flags=frozenset({"COMPLETING"}), excluded_nodes=("n9",))
    run(sup, slurm, launcher, channel)
    assert ("update_excluded_nodes", JOB, ["n2", "n9"]) in slurm.calls


def test_every_agent_silent_at_once_blames_no_node_even_when_one_crossed_the_threshold_first(tmp_path: Path) -> None:
    """Agents' summaries are staggered: n1's went quiet a moment before n2's. Both are reported in the same
    pass and the watch hands every fault of it to the classifier: class unknown, nobody blamed, relaunched."""
    quiet = Launch(None, ranks={"beat_age_s": None}, node_staleness={"n1": 10.5, "n2": 9.7})
    r = supervise(tmp_path, quiet, Launch(0, ranks={"state": "exited", "exit_code": 0}))
    assert r.classes() == [ev.UNKNOWN, ev.COMPLETED]
    first = r.of(ev.INTERRUPTION)[0]
    assert first["blamed_nodes"] == [] and "node agents are silent" in first["evidence"][0]
    assert sorted(n for d in r.of(ev.DETECTION) if d["kind"] == "node_silent" for n in d["nodes"]) == ["n1", "n2"]
    assert policy.RESTART_IN_ALLOCATION in r.actions()
    assert not [c for c in r.slurm.calls if c[0] in ("requeue", "update_excluded_nodes")]


def test_every_rank_gone_while_srun_tears_the_step_down_slowly_is_a_finish_not_a_fault(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    """Under load srun may take longer than the exit grace to end after its ranks (a relaunch that resumed at the
    last step exits at once): the agents cannot read a non-child's exit code, so srun's is the evidence; waiting
    for it gives "completed" instead of "no evidence explains the stop"."""
    from supervisor.decisions import triage

    monkeypatch.setattr(triage, "EXIT_GRACE_S", 0.05)
    slow_srun = Launch(0, polls=400, ranks={"state": "exited", "exit_code": None})
    r = supervise(tmp_path, slow_srun)
    assert r.classes() == [ev.COMPLETED] and r.code == 0


def test_every_launch_gets_the_distributed_env_and_a_relaunch_a_fresh_master_port(tmp_path: Path) -> None:
    r = supervise(tmp_path, Launch(1, log=TRACEBACK), Launch(0, ranks={"state": "exited", "exit_code": 0}))
    training = [(a, e) for a, e in zip(r.launcher.argvs, r.launcher.envs, strict=True)
                if any(w.startswith("--job-name=train-") for w in a)]  # not the agents', not a preflight's
    envs, argvs = [e for _, e in training], [a for a, _ in training]
    assert [e["MASTER_ADDR"] for e in envs] == ["127.0.0.1", "127.0.0.1"]  # n1's NodeAddr
    assert [e["WORLD_SIZE"] for e in envs] == ["2", "2"] and envs[0]["LOCAL_WORLD_SIZE"] == "1"
    assert envs[0]["MASTER_PORT"] != envs[1]["MASTER_PORT"]
    assert [e["master"] for e in r.of(ev.STEP_LAUNCHED)] == [f"127.0.0.1:{e['MASTER_PORT']}" for e in envs]
    assert "--nodelist=n[1-2]" in argvs[0]
    assert argvs[0][-6:] == ["/bin/sh", "-c", argvs[0][-4], "sh", "python", "train.py"]
    assert "MASTER_ADDR" not in next(e for a, e in zip(r.launcher.argvs, r.launcher.envs, strict=True) if "supervisor.agent" in a)

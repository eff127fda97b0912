"""The agents' failsafe: when the supervisor and its batch host are gone, the lowest-named surviving agent
requeues the job without the batch host (or cancels it when the requeue is refused) and journals it; the next
run's supervisor reads it back as a node failure of the batch host."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from slurm.errors import SlurmCommandError
from slurm.model import JobInfo
from slurm.probe import Probe
from supervisor.agent import failsafe as fs
from supervisor.agent.main import Agent, build_parser, failsafe_from_args
from supervisor.decisions import campaign_state, silent_end
from supervisor.decisions import events as ev
from supervisor.heartbeat import wire
from supervisor.journal import Journal, read
from supervisor.paths import expand_slot_dir

NODES = ("n1", "n2", "n3", "n4", "n5", "n6")


class Proc:
    def __init__(self, code: int) -> None:
        self.returncode: int | None = code

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0


class Slurm:
    def __init__(self, job: JobInfo, refuse_requeue: bool = False) -> None:
        self.job_info, self.refuse_requeue = job, refuse_requeue
        self.calls: list[tuple[Any, ...]] = []

    def job(self, job_id: str) -> JobInfo:
        return self.job_info

    def requeue(self, job_id: str) -> None:
        if self.refuse_requeue:
            raise SlurmCommandError(["scontrol", "requeue"], 1, "Requested operation is disabled")
        self.calls.append(("requeue", job_id))
        self.job_info = replace(self.job_info, state="COMPLETING", flags=frozenset({"COMPLETING"}))

    def cancel(self, job_id: str) -> None:
        self.calls.append(("cancel", job_id))

    def update_excluded_nodes(self, job_id: str, nodes: Any) -> None:
        self.calls.append(("exclude", job_id, list(nodes)))


def running_job(**changes: Any) -> JobInfo:
    job = JobInfo(job_id="9", state="RUNNING", base_state="RUNNING", nodes=NODES[:3], batch_host="n1",
                  excluded_nodes=("n9",))  # fmt: skip
    return replace(job, **changes)


def make(tmp_path: Path, *, alive: bool = False, node: str = "n2", slurm: Slurm | None = None) -> fs.Failsafe:
    def start_probe(name: str, timeout_s: float) -> Probe:
        assert name == "n1"
        return Probe(name, Proc(0 if alive else 1), time.monotonic(), timeout_s)

    Journal(tmp_path / "journal.jsonl").close()
    return fs.Failsafe(job_id="9", node=node, batch_host="n1", nodes=NODES[:3], restart_count=0, campaign=tmp_path,
                       timeout_s=10.0, start_probe=start_probe, slurm=slurm or Slurm(running_job()),
                       sleep=lambda s: None)  # fmt: skip


def test_the_lowest_named_node_other_than_the_batch_host_goes_first() -> None:
    assert [fs.turn(n, NODES, "n1") for n in NODES] == [None, 0, 1, 2, 3, None]  # batch host never; only 4 turns
    assert fs.turn("n7", NODES, "n1") is None


def test_a_dead_batch_host_gets_the_job_requeued_without_it_and_journaled(tmp_path: Path) -> None:
    slurm = Slurm(running_job())
    f = make(tmp_path, slurm=slurm)
    assert f.due(0.0, 0.0) and f.waiting
    assert f.act("no word from the supervisor for 10.5 s", 0.0) == "requeue of job 9 without n1, n9"
    assert slurm.calls == [("requeue", "9"), ("exclude", "9", ["n1", "n9"])]  # the user's exclusion kept
    (event,) = read(tmp_path / "journal.jsonl")
    assert event["type"] == ev.FAILSAFE and event["action"] == "requeue" and event["exclude"] == ["n1", "n9"]
    assert not f.due(99.0, 99.0)  # done once


def test_an_answering_batch_host_means_the_supervisor_is_only_busy(tmp_path: Path) -> None:
    slurm = Slurm(running_job())
    f = make(tmp_path, alive=True, slurm=slurm)
    assert f.act("silent", 0.0) == "" and slurm.calls == [] and not f.waiting
    assert not f.due(0.0, 5.0) and f.due(0.0, 10.0)  # probed again later


def test_a_run_already_ended_is_left_alone(tmp_path: Path) -> None:
    slurm = Slurm(running_job(restart_count=1))
    f = make(tmp_path, slurm=slurm)
    assert "already" in f.act("silent", 0.0) and slurm.calls == []


def test_a_refused_requeue_cancels_and_ends_the_campaign(tmp_path: Path) -> None:
    slurm = Slurm(running_job(), refuse_requeue=True)
    f = make(tmp_path, slurm=slurm)
    assert f.act("silent", 0.0).startswith("cancel")
    assert slurm.calls == [("cancel", "9")]
    assert [e["type"] for e in read(tmp_path / "journal.jsonl")] == [ev.FAILSAFE, ev.CAMPAIGN_ENDED]


def test_later_turns_wait_for_the_ones_before(tmp_path: Path) -> None:
    f = make(tmp_path, node="n3")
    assert f.turn == 1 and not f.due(f.stagger_s - 0.1, 0.0) and f.due(f.stagger_s, 0.0)


def test_the_next_run_reads_the_failsafe_as_the_batch_hosts_failure() -> None:
    events = [
        ev.campaign_started(1.0, "/c", ["x"], "9"),
        ev.attempt_started(2.0, "9", 0, ["n1", "n2"], None),
        ev.failsafe(30.0, "n2", "requeue", "n1", "9", "no word from the supervisor", ["n1"]),
    ]
    state = campaign_state.fold(events)
    interruption, ended = silent_end.infer_previous_outcome(state, [], None)
    assert interruption["class"] == ev.NODE_FAILURE and interruption["blamed_nodes"] == ["n1"]
    assert ended["type"] == ev.ATTEMPT_ENDED


def test_the_agent_waits_for_its_turn_instead_of_leaving_and_then_acts(tmp_path: Path) -> None:
    slot = expand_slot_dir(str(tmp_path / "slots-{node}"), job="9", node="n3")
    slurm = Slurm(running_job())
    f = make(tmp_path, node="n3", slurm=slurm)
    agent = Agent(job="9", node="n3", key=wire.derive_key(b"a" * 32), supervisor=("127.0.0.1", 9), slot_dir=slot,
                  campaign=tmp_path, keep_slot_dir=True, supervisor_timeout_s=12.0, failsafe=f)  # fmt: skip
    try:
        agent.last_contact = 0.0
        assert agent._should_exit(5.0) == ""  # not gone yet
        assert agent._should_exit(10.5) == "" and slurm.calls == []  # gone; turn 1 waits for turn 0
        assert agent._should_exit(13.0) == ""  # past supervisor_timeout_s, still waiting for its turn
        assert agent._should_exit(10.5 + f.stagger_s).startswith("the supervisor is gone; failsafe: requeue")
        assert slurm.calls[0] == ("requeue", "9")
    finally:
        agent.close()


def test_the_failsafe_is_on_only_with_a_batch_host(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--campaign", str(tmp_path), "--job-id", "9", "--node", "n2"])
    assert failsafe_from_args(args, tmp_path) is None
    args = build_parser().parse_args(["--campaign", str(tmp_path), "--job-id", "9", "--node", "n2", "--batch-host",
                                      "n1", "--job-nodes", "n[1-3]", "--restart-count", "2"])  # fmt: skip
    made = failsafe_from_args(args, tmp_path)
    assert made is not None and made.turn == 0 and made.restart_count == 2 and made.nodes == ["n1", "n2", "n3"]
    with pytest.raises(Exception, match="hostlist"):
        failsafe_from_args(build_parser().parse_args(["--campaign", str(tmp_path), "--job-id", "9", "--batch-host",
                                                      "n1", "--job-nodes", "n[1-"]), tmp_path)  # fmt: skip

"""Parsers against real Slurm 24.11.5 captures (Debian 13 packages, `make test-slurm24`'s cluster) and, where the
same capture was made there, Slurm 26.05.5 ones (Debian sid, `make test-slurm26`'s cluster; data_parser v0.0.45).

The files come from tests/unit/fixtures/slurm/capture.py; tests find jobs by name, not id, so a recapture only
needs the file names to stay. Each test pins a 24.11 behaviour the adapter relies on, or one that differs from
22.05 (documented in docs/local-cluster.md); the tests taking ``real`` check that 26.05 behaves the same.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm.env import SlurmEnv
from slurm.model import JobInfo
from slurm.parse import parse_nodes_json, parse_squeue_json
from slurm.parse_scontrol import parse_scontrol_jobs, parse_scontrol_nodes
from slurm.retry import Failure, classify_failure

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
REAL = FIXTURES / "24.11"


@pytest.fixture(params=["24.11", "26.05"])
def real(request: pytest.FixtureRequest) -> Path:
    """A directory of captures made by capture.py, one per Slurm version."""
    return FIXTURES / request.param


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """scontrol prints local time; capture.py ran with TZ=UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def only_job(name: str, real: Path = REAL) -> JobInfo:
    jobs = parse_squeue_json((real / name).read_text())
    assert len(jobs) == 1, f"{name}: 24.11 applies --jobs in JSON mode, so exactly one job"
    return jobs[0]


def test_captures_are_24_11_and_26_05() -> None:
    versions = json.loads((REAL / "versions.json").read_text())
    assert versions["sinfo -V"].startswith("slurm-wlm 24.11") and versions["data_parser"] == "data_parser/v0.0.42"
    newest = json.loads((FIXTURES / "26.05" / "versions.json").read_text())
    assert newest["sinfo -V"].startswith("slurm-wlm 26.05") and newest["data_parser"] == "data_parser/v0.0.45"


def test_running_job(real: Path) -> None:
    job = only_job("squeue_running.json", real)
    assert (job.name, job.state, job.base_state, job.flags) == ("fx-running", "RUNNING", "RUNNING", frozenset())
    assert job.is_running and not job.is_held and job.requeue is True and job.restart_count == 0
    assert job.nodes == ("node2", "node3") and job.batch_host == "node2" and job.excluded_nodes == ("node1",)
    assert job.time_limit_min is None  # UNLIMITED: {"set": false, "infinite": true}
    assert job.end_time is None  # Slurm's stand-in (start + 365 days) is no deadline: scontrol says Unknown


def test_requeue_held_job_is_held_by_priority_zero(real: Path) -> None:
    job = only_job("squeue_held.json", real)
    assert job.state == "PENDING" and job.flags == frozenset()  # no REQUEUE_HOLD flag in job_state
    assert job.is_pending and job.is_held and job.priority == 0 and job.restart_count == 1
    assert job.reason == "JobHeldUser" and job.nodes == ()
    assert job.end_time is None  # the JSON holds a meaningless end (year 2163) while pending without a limit


def test_rerun_after_requeue_and_exclusion(real: Path) -> None:
    job = only_job("squeue_running_restart1.json", real)
    assert job.is_running and job.restart_count == 1 and job.excluded_nodes == ("node1", "node4")
    # 24.11.5 turned the UNLIMITED limit into 365 days after `scontrol update ExcNodeList=`: a real limit now
    assert job.time_limit_min == 365 * 24 * 60 and job.end_time == job.start_time + 365 * 24 * 3600  # type: ignore[operator]


def test_failed_job_exit_code_and_reason(real: Path) -> None:
    job = only_job("squeue_finished.json", real)
    assert (job.name, job.state, job.exit_code, job.exit_signal) == ("fx-exit3", "FAILED", 3, None)
    assert job.reason == "NonZeroExitCode" and job.is_finished


def test_finished_jobs_need_states_all(real: Path) -> None:
    """24.11's `squeue --json --jobs=J` omits a finished job that slurmctld still knows (22.05 listed it)."""
    assert parse_squeue_json((real / "squeue_finished_default.json").read_text()) == []


@pytest.mark.parametrize(
    ("json_file", "text_file"),
    [
        ("squeue_running.json", "scontrol_running.txt"),
        ("scontrol_json_running.json", "scontrol_running.txt"),
        ("squeue_running_restart1.json", "scontrol_running_restart1.txt"),
        ("squeue_held.json", "scontrol_held.txt"),
        ("squeue_finished.json", "scontrol_failed_exit3.txt"),
    ],
)
def test_text_and_json_agree(utc: None, json_file: str, text_file: str, real: Path) -> None:
    """The `scontrol show job -o` fallback gives the supervisor what the JSON gives (the held job's reason is
    worded differently: scontrol prints the state description there, the JSON its reason code)."""
    (from_text,) = parse_scontrol_jobs((real / text_file).read_text())
    from_json = only_job(json_file, real)
    skip = {"source", "reason"} if json_file == "squeue_held.json" else {"source"}
    assert {k: v for k, v in from_text.__dict__.items() if k not in skip} == {
        k: v for k, v in from_json.__dict__.items() if k not in skip}
    if json_file == "squeue_held.json":
        assert (from_json.reason, from_text.reason) == ("JobHeldUser", "job_requeued_in_held_state")
        assert from_json.is_held and from_text.is_held


def test_empty_json_answers_look_the_same_for_unknown_job_and_unreachable_controller() -> None:
    """Exit 0 and no jobs either way (measured): the adapter must not read an empty answer as "no such job"."""
    unknown = json.loads((REAL / "scontrol_json_unknown_job.json").read_text())
    unreachable = json.loads((REAL / "scontrol_json_unreachable.json").read_text())
    assert unknown == unreachable and unknown["jobs"] == [] and unknown["errors"] == []
    assert parse_squeue_json(json.dumps(unknown)) == []


@pytest.mark.parametrize("name", ["scontrol_unknown_job.stderr", "squeue_unknown_job.stderr"])
def test_unknown_job_errors_are_classified(name: str, real: Path) -> None:
    assert classify_failure(1, (real / name).read_text()) is Failure.UNKNOWN_JOB


def test_idle_nodes_json_and_text_agree(utc: None, real: Path) -> None:
    groups = {n.name: n for n in parse_nodes_json((real / "sinfo_idle.json").read_text())}
    by_scontrol = {n.name: n for n in parse_nodes_json((real / "scontrol_json_nodes.json").read_text())}
    by_text = {n.name: n for n in parse_scontrol_nodes((real / "scontrol_nodes.txt").read_text())}
    assert set(groups) == set(by_scontrol) == set(by_text) == {"node1", "node2", "node3", "node4"}
    for nodes in (groups, by_scontrol, by_text):
        assert all(n.state == "IDLE" and n.is_usable and n.partitions == ("batch", "urgent") for n in nodes.values())
    strip = lambda nodes: {k: {**n.__dict__, "source": ""} for k, n in nodes.items()}  # noqa: E731
    assert strip(by_scontrol) == strip(by_text)
    assert by_text["node2"].reason is None  # sinfo's group carries node1's old reason for all four: see below


def test_resumed_node_keeps_its_reason_and_sinfo_gives_it_to_the_whole_group(utc: None) -> None:
    """Captured right after a drain + resume of node1: scontrol still shows node1's reason (node1 only); sinfo's
    node group node[1-4] carries it for all four. Per-node truth comes from scontrol."""
    by_text = {n.name: n for n in parse_scontrol_nodes((REAL / "scontrol_nodes_reason_kept.txt").read_text())}
    by_json = {n.name: n for n in parse_nodes_json((REAL / "scontrol_json_nodes_reason_kept.json").read_text())}
    grouped = {n.name: n for n in parse_nodes_json((REAL / "sinfo_reason_smeared.json").read_text())}
    for nodes in (by_text, by_json):
        assert nodes["node1"].reason == "fixture capture" and nodes["node1"].is_usable
        assert nodes["node2"].reason is None
    assert {n.reason for n in grouped.values()} == {"fixture capture"}


def test_drained_node_json_and_text_agree(utc: None, real: Path) -> None:
    from_json = {n.name: n for n in parse_nodes_json((real / "sinfo_drain.json").read_text())}
    from_text = {n.name: n for n in parse_scontrol_nodes((real / "scontrol_nodes_drain.txt").read_text())}
    for nodes in (from_json, from_text):
        drained = nodes["node1"]
        assert drained.state == "IDLE" and drained.flags == {"DRAIN"} and drained.is_drain and not drained.is_usable
        assert drained.reason == "fixture capture" and drained.reason_user == "root"
        assert {nodes[n].state for n in ("node2", "node3")} == {"MIXED"}  # the running job's nodes
    assert from_json["node1"].reason_time == from_text["node1"].reason_time


def test_batch_environment(real: Path) -> None:
    pairs = (line.split("=", 1) for line in (real / "env_batch_step.txt").read_text().splitlines() if "=" in line)
    env = SlurmEnv.from_environ(dict(pairs))
    assert env.in_allocation and env.in_batch_step and env.restart_count == 0
    assert env.nodelist == ("node2", "node3") and env.tasks_per_node == (2, 2) and env.batch_host == "node2"
    assert env.end_time is not None  # SLURM_JOB_END_TIME exists from 23.02 (start + 365 days when unlimited)
    pairs = (line.split("=", 1) for line in (real / "env_batch_step_restart1.txt").read_text().splitlines()
             if "=" in line)
    assert SlurmEnv.from_environ(dict(pairs)).restart_count == 1

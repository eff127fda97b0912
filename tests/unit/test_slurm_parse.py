"""Parsers against real 22.05 captures and documented 24.11-shaped outputs."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm.model import JobInfo
from slurm.parse import (
    ParseError,
    exit_status,
    job_state,
    node_state,
    number,
    parse_nodes_json,
    parse_squeue_json,
    timestamp,
)
from slurm.parse_sacct import parse_sacct_json, parse_sacct_text
from slurm.parse_scontrol import duration_minutes, parse_key_values, parse_scontrol_jobs, parse_scontrol_nodes

FIX = Path(__file__).parent / "fixtures" / "slurm"
OLD = FIX / "22.05"
NEW = FIX / "24.11"


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """scontrol prints local time; the fixtures were captured with TZ=UTC."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def _jobs(path: Path) -> dict[str, JobInfo]:
    return {j.job_id: j for j in parse_squeue_json(path.read_text())}


# ------------------------------------------------------------------------------------------- values


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(5, 5), ("7", 7), ({"set": True, "infinite": False, "number": 3}, 3),
     ({"set": False, "infinite": False, "number": 0}, None), ({"set": True, "infinite": True, "number": 0}, None),
     (None, None), ("x", None), (2.0, 2)],
)  # fmt: skip
def test_number_shapes(raw: object, expected: int | None) -> None:
    assert number(raw) == expected


def test_timestamp_zero_means_unset() -> None:
    assert timestamp(0) is None
    assert timestamp({"set": True, "infinite": False, "number": 0}) is None
    assert timestamp(1796209131) == 1796209131


@pytest.mark.parametrize(
    ("raw", "base", "flags"),
    [
        ("RUNNING", "RUNNING", set()),
        (["PENDING", "REQUEUE_HOLD"], "PENDING", {"REQUEUE_HOLD"}),
        (["CANCELLED", "COMPLETING"], "CANCELLED", {"COMPLETING"}),
        ("COMPLETING", None, {"COMPLETING"}),
        ("PENDING+REQUEUED", "PENDING", {"REQUEUED"}),
        ("", None, set()),
    ],
)
def test_job_state_shapes(raw: object, base: str | None, flags: set[str]) -> None:
    assert job_state(raw) == (base, frozenset(flags))


@pytest.mark.parametrize(
    ("raw", "extra", "base", "flags"),
    [
        ("idle", [], "IDLE", set()),
        ("mixed", ["DRAIN"], "MIXED", {"DRAIN"}),
        (["IDLE", "DRAIN", "NOT_RESPONDING"], [], "IDLE", {"DRAIN", "NOT_RESPONDING"}),
        ("DOWN+DRAIN+NOT_RESPONDING", [], "DOWN", {"DRAIN", "NOT_RESPONDING"}),
        ("IDLE+DRAIN", [], "IDLE", {"DRAIN"}),
        ("idle*", [], "IDLE", {"NOT_RESPONDING"}),
        ("drng", [], "ALLOCATED", {"DRAIN"}),
        ("DRAINED", [], "IDLE", {"DRAIN"}),
        ("alloc", [], "ALLOCATED", set()),
    ],
)
def test_node_state_shapes(raw: object, extra: list[str], base: str, flags: set[str]) -> None:
    assert node_state(raw, extra) == (base, frozenset(flags))


@pytest.mark.parametrize(
    ("raw", "code", "signal"),
    [
        (768, 3, None),  # 22.05 JSON: raw wait status of exit(3)
        (9, 0, 9),  # raw wait status of SIGKILL
        ("3:0", 3, None),
        ("0:9", 0, 9),
        ({"status": ["ERROR"], "return_code": {"set": True, "infinite": False, "number": 3},
          "signal": {"id": {"set": False, "infinite": False, "number": 0}, "name": ""}}, 3, None),
        ({"status": ["SIGNALED"], "return_code": {"set": False, "infinite": False, "number": 0},
          "signal": {"id": {"set": True, "infinite": False, "number": 9}, "name": "KILL"}}, 0, 9),
        ({"status": "SUCCESS", "return_code": 0}, 0, None),
        (None, None, None),
    ],
)  # fmt: skip
def test_exit_status_shapes(raw: object, code: int | None, signal: int | None) -> None:
    assert exit_status(raw) == (code, signal)


@pytest.mark.parametrize(
    ("raw", "minutes"), [("00:02:00", 2), ("1-00:00:00", 1440), ("05:30", 6), ("UNLIMITED", None), ("N/A", None)]
)
def test_duration_minutes(raw: str, minutes: int | None) -> None:
    assert duration_minutes(raw) == minutes


# ------------------------------------------------------------------------------------------- 22.05 jobs


def test_22_05_running_job() -> None:
    job = _jobs(OLD / "squeue_running.json")["1"]
    assert job.state == "RUNNING" and job.is_running and not job.is_finished
    assert job.restart_count == 0
    assert job.nodes == ("node1", "node2") and job.batch_host == "node1"
    assert job.excluded_nodes == ()
    assert job.requeue is True
    assert job.end_time == 1796209208 and job.time_limit_min == 2
    assert job.reason is None and job.preempt_time is None
    assert job.name == "engA-capture" and job.partition == "batch"


def test_22_05_requeued_job_is_pending_with_restart_count() -> None:
    job = _jobs(OLD / "squeue_pending_requeued.json")["1"]
    assert job.is_pending and job.reason == "BeginTime"
    assert job.restart_count == 1
    assert job.nodes == () and job.batch_host is None


def test_22_05_preempted_job_shows_preempt_time_and_grace_end() -> None:
    jobs = _jobs(OLD / "squeue_preempting.json")
    victim = jobs["1"]
    assert victim.is_running and victim.preempt_time == 1796209131
    assert victim.end_time == victim.preempt_time + 10  # GraceTime=10 of the batch partition
    assert victim.excluded_nodes == ("node1",)
    assert jobs["2"].is_pending and jobs["2"].reason == "Resources" and jobs["2"].partition == "urgent"


def test_22_05_finished_jobs() -> None:
    jobs = _jobs(OLD / "squeue_finished.json")
    assert set(jobs) == {"1", "2", "3", "4"}  # 22.05 lists the whole queue whatever --jobs says
    assert jobs["1"].state == "CANCELLED" and jobs["1"].is_finished
    assert jobs["2"].state == "COMPLETED" and jobs["2"].exit_code == 0
    assert (jobs["3"].state, jobs["3"].reason, jobs["3"].exit_code) == ("FAILED", "NonZeroExitCode", 3)
    assert (jobs["4"].exit_code, jobs["4"].exit_signal) == (0, 9)


@pytest.mark.parametrize(
    ("json_file", "text_file"),
    [
        ("squeue_running.json", "scontrol_running.txt"),
        ("squeue_running_restart1.json", "scontrol_running_restart1.txt"),
        ("squeue_pending_requeued.json", "scontrol_pending_requeued.txt"),
        ("squeue_preempting.json", "scontrol_preempting.txt"),
        ("squeue_finished.json", "scontrol_failed_exit3.txt"),
        ("squeue_finished.json", "scontrol_killed_sig9.txt"),
    ],
)
def test_22_05_scontrol_text_and_json_agree(utc: None, json_file: str, text_file: str) -> None:
    """The fallback parser must give the supervisor exactly what the JSON parser gives."""
    (from_text,) = parse_scontrol_jobs((OLD / text_file).read_text())
    from_json = _jobs(OLD / json_file)[from_text.job_id]
    assert {**from_text.__dict__, "source": ""} == {**from_json.__dict__, "source": ""}
    assert from_text.source == "scontrol" and from_json.source == "squeue-json"


# ------------------------------------------------------------------------------------------- 24.11 jobs


def test_24_11_job_shapes() -> None:
    jobs = _jobs(NEW / "squeue.json")
    run = jobs["101"]
    assert run.is_running and run.restart_count == 1 and run.nodes == ("node2", "node3")
    assert run.excluded_nodes == ("node1",) and run.end_time == 1796209095 + 131 and run.time_limit_min == 2
    pend = jobs["102"]
    assert pend.is_pending and pend.reason == "BeginTime" and pend.excluded_nodes == ("node1", "node4")
    assert jobs["103"].preempt_time == 1796209095 + 36
    assert (jobs["104"].exit_code, jobs["104"].exit_signal, jobs["104"].reason) == (3, None, "NonZeroExitCode")
    assert (jobs["105"].exit_code, jobs["105"].exit_signal) == (0, 9)
    held = jobs["106"]
    assert held.state == "REQUEUE_HOLD" and held.base_state == "PENDING" and held.is_held and held.is_pending
    completing = jobs["107"]
    assert completing.state == "COMPLETING" and completing.is_completing and not completing.is_finished
    array_task = jobs["108_2"]
    assert array_task.time_limit_min is None  # infinite


def test_squeue_json_rejects_garbage() -> None:
    with pytest.raises(ParseError):
        parse_squeue_json("slurm_load_jobs error: Unable to contact slurm controller")
    with pytest.raises(ParseError):
        parse_squeue_json('{"meta": {}}')


def test_json_after_leading_noise_is_parsed() -> None:
    text = "squeue: warning: something\n" + (OLD / "squeue_running.json").read_text()
    assert "1" in {j.job_id for j in parse_squeue_json(text)}


# ------------------------------------------------------------------------------------------- nodes


def test_22_05_sinfo_nodes() -> None:
    nodes = {n.name: n for n in parse_nodes_json((OLD / "sinfo.json").read_text())}
    assert set(nodes) == {"node1", "node2", "node3", "node4"}
    assert nodes["node1"].state == "MIXED" and nodes["node1"].partitions == ("batch", "urgent")
    assert all(n.is_usable for n in nodes.values())


def test_22_05_drained_nodes_json_and_text(utc: None) -> None:
    from_json = {n.name: n for n in parse_nodes_json((OLD / "sinfo_drain.json").read_text())}
    from_text = {n.name: n for n in parse_scontrol_nodes((OLD / "scontrol_nodes_drain.txt").read_text())}
    for nodes in (from_json, from_text):
        busy, idle = nodes["node3"], nodes["node4"]
        assert busy.state == "MIXED" and busy.is_drain and not busy.is_usable
        assert idle.state == "IDLE" and idle.flags == {"DRAIN"}
        assert idle.reason == "engA capture: maint Foo=bar test"  # spaces and '=' inside a Reason survive
        assert busy.reason == "engA busy drain" and busy.reason_user == "root"
        assert nodes["node1"].is_usable
    assert from_json["node4"].reason_time == from_text["node4"].reason_time == 1796209112


def test_24_11_sinfo_groups_are_merged_per_node() -> None:
    nodes = {n.name: n for n in parse_nodes_json((NEW / "sinfo.json").read_text())}
    assert set(nodes) == {"node1", "node2", "node3", "node4"}
    assert nodes["node1"].partitions == ("batch", "urgent") and nodes["node1"].is_usable
    assert nodes["node3"].is_drain and nodes["node3"].reason == "supervise: hang on node3 Foo=bar"
    assert nodes["node3"].reason_user == "root" and nodes["node3"].reason_time == 1796209095 + 17
    assert nodes["node4"].state == "DOWN" and nodes["node4"].is_down


def test_24_11_scontrol_show_node_json() -> None:
    nodes = {n.name: n for n in parse_nodes_json((NEW / "scontrol_show_node.json").read_text())}
    assert nodes["node4"].flags == {"DRAIN", "NOT_RESPONDING"} and nodes["node4"].is_down
    assert nodes["node3"].state == "MIXED" and nodes["node3"].is_drain


def test_nodes_json_needs_nodes_or_sinfo() -> None:
    with pytest.raises(ParseError):
        parse_nodes_json('{"partitions": []}')


# ------------------------------------------------------------------------------------------- key=value


def test_key_values_keep_free_text_whole() -> None:
    line = (
        "NodeName=node2 State=DOWN+NOT_RESPONDING OS=Linux 6.1 #1 SMP Weight=1 "
        "Reason=Not responding Foo=bar [slurm@2026-12-02T10:00:00] Comment=two words"
    )
    fields = parse_key_values(line)
    assert fields["OS"] == "Linux 6.1 #1 SMP"
    assert fields["Reason"] == "Not responding Foo=bar [slurm@2026-12-02T10:00:00]"
    assert fields["Comment"] == "two words"
    assert fields["State"] == "DOWN+NOT_RESPONDING"


def test_key_values_values_with_equals() -> None:
    fields = parse_key_values("JobId=5 TRES=cpu=4,node=2,billing=4 Power= NodeList=node[1-2]")
    assert fields == {"JobId": "5", "TRES": "cpu=4,node=2,billing=4", "Power": "", "NodeList": "node[1-2]"}


def test_scontrol_node_reason_user_and_time(utc: None) -> None:
    (node,) = parse_scontrol_nodes(
        "NodeName=node2 State=IDLE+DRAIN Partitions=batch Reason=Kill task failed [root@2026-12-02T10:58:32]"
    )
    assert node.reason == "Kill task failed" and node.reason_user == "root"
    assert node.reason_time == 1796209112


# ------------------------------------------------------------------------------------------- sacct


def test_sacct_runs_in_both_shapes() -> None:
    new = parse_sacct_json((NEW / "sacct.json").read_text())
    assert [r.state for r in new] == ["REQUEUED", "COMPLETED"]  # oldest run first
    assert new[0].nodes == ("node1", "node2") and new[1].restart_count == 1
    old = parse_sacct_json((OLD / "sacct_crafted.json").read_text())
    assert [(r.state, r.exit_code) for r in old] == [("REQUEUED", 0), ("FAILED", 1)]
    assert old[1].restart_count is None


def test_22_05_requeue_held_job(utc: None) -> None:
    """After ``scontrol requeuehold`` 22.05 shows a plain PENDING job; the hold is priority 0."""
    from_json = _jobs(OLD / "squeue_held.json")["14"]
    (from_text,) = parse_scontrol_jobs((OLD / "scontrol_held.txt").read_text())
    for job in (from_json, from_text):
        assert job.is_pending and job.is_held and job.priority == 0 and job.restart_count == 1
    assert from_json.reason == "JobHeldUser" and from_text.reason == "job_requeued_in_held_state"
    running = _jobs(OLD / "squeue_running.json")["1"]
    assert not running.is_held and running.priority and running.priority > 0


def test_22_05_array_tasks_keep_both_ids() -> None:
    """Inside an array task SLURM_JOB_ID is the raw id; users and squeue say 30_2. Both must find the task."""
    jobs = parse_squeue_json((OLD / "squeue_array.json").read_text())
    tasks = {j.job_id: j.raw_job_id for j in jobs if j.name == "engA-array"}
    assert tasks == {"30_1": "31", "30_2": "30"}
    by_text = {j.job_id: j.raw_job_id for j in parse_scontrol_jobs((OLD / "scontrol_array_all_tasks.txt").read_text())}
    assert by_text == tasks
    plain = _jobs(OLD / "squeue_running.json")["1"]
    assert plain.raw_job_id == plain.job_id == "1"


def test_22_05_sacct_text_runs(utc: None) -> None:
    """Real accounting (private cluster with slurmdbd): one line per run, oldest first."""
    runs = parse_sacct_text((OLD / "sacct_runs.txt").read_text())
    first, second, failed = runs
    assert (first.state, first.restart_count, first.nodes) == ("REQUEUED", 0, ("node1",))
    assert (second.state, second.restart_count, second.reason) == ("CANCELLED", 1, "BeginTime")
    assert (failed.job_id, failed.state, failed.exit_code, failed.exit_signal) == ("2", "FAILED", 3, None)
    assert first.start_time == 1796210509 and first.end_time == 1796210511  # same instants as the JSON


def test_22_05_sacct_json_loses_the_exit_code(utc: None) -> None:
    """Why history() reads text: 22.05's sacct --json says SUCCESS/0 for a job sacct's text shows as 3:0."""
    (from_json,) = parse_sacct_json((OLD / "sacct_failed.json").read_text())
    assert from_json.state == "FAILED" and from_json.exit_code == 0
    requeued = parse_sacct_json((OLD / "sacct_requeued.json").read_text())
    assert [r.state for r in requeued] == ["REQUEUED", "CANCELLED"]


def test_sacct_text_rejects_unexpected_columns() -> None:
    with pytest.raises(ParseError):
        parse_sacct_text("1|1|COMPLETED\n")

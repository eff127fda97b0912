"""``supervise nodes CAMPAIGN --forgive NODE`` lets a repaired node back in: out of the ledger and out of the
job's ExcNodeList, where an earlier requeue wrote it (else a held job could still never start)."""

from __future__ import annotations

import pytest
from fakes import FakeChannel, FakeSlurm

import slurm.client
from slurm.model import JobInfo
from supervisor.commands.nodes import let_back_in


def pending(excluded: tuple[str, ...], **kw: object) -> JobInfo:
    return JobInfo(job_id="7", state="PENDING", base_state="PENDING", excluded_nodes=excluded, **kw)  # type: ignore[arg-type]


@pytest.fixture
def fake(monkeypatch) -> FakeSlurm:
    client = FakeSlurm(pending(("n1", "n4")), ("n1", "n2"), FakeChannel("7"))
    monkeypatch.setattr(slurm.client, "get_client", lambda *a, **k: client)
    return client


def test_a_forgiven_node_leaves_the_pending_jobs_exclusions_and_the_users_own_stay(fake: FakeSlurm):
    fake.set_job(priority=0, reason="job_requeued_in_held_state")
    line = let_back_in("7", ["n1"])
    assert ("update_excluded_nodes", "7", ["n4"]) in fake.calls
    assert "n1 taken out of job 7's ExcNodeList" in line and "scontrol release 7" in line


def test_a_running_job_is_not_changed_and_the_line_says_when_to_run_it_again(fake: FakeSlurm):
    fake.set_job(state="RUNNING", base_state="RUNNING")
    line = let_back_in("7", ["n1"])
    assert not [c for c in fake.calls if c[0] == "update_excluded_nodes"]
    assert "only while the job is pending" in line


def test_slurm_unreachable_is_one_line_with_the_manual_command(fake: FakeSlurm):
    fake.unreachable = True
    line = let_back_in("7", ["n1"])
    assert "\n" not in line and "ExcNodeList was not changed" in line and "scontrol update JobId=7" in line


def test_a_node_the_job_does_not_exclude_changes_nothing(fake: FakeSlurm):
    assert "does not exclude them" in let_back_in("7", ["n2"]) and not fake.calls
    assert "no Slurm job" in let_back_in(None, ["n2"])

"""A Slurm run that ended without its supervisor's word (issue 26, "accounting"): the next run reads that run's
accounting record (sacct) where nothing more certain says how it ended, and names it in the evidence."""

from __future__ import annotations

from typing import Any

import pytest
from fakes import FakeChannel, FakeSlurm

from slurm.errors import AccountingUnavailable, SlurmUnreachable
from slurm.model import JobInfo, JobRun
from supervisor.decisions import campaign_state, silent_end
from supervisor.decisions import events as ev

STARTED = 1_000_000.0


def silent_run(*extra: dict[str, Any]) -> campaign_state.CampaignState:
    """Job 7's run 1 started at STARTED and was never heard of again."""
    return campaign_state.fold([ev.campaign_started(STARTED - 100, "/c", ["python"], "7"),
                                ev.attempt_started(STARTED, "7", 1, ["n1", "n2"], None), *extra])  # fmt: skip


def run(state: str, start: float = STARTED + 2, **kw: Any) -> JobRun:
    return JobRun(job_id="7", state=state, start_time=int(start), end_time=int(start + 50), nodes=("n1", "n2"), **kw)


@pytest.mark.parametrize("state, cls", [("NODE_FAIL", ev.NODE_FAILURE), ("PREEMPTED", ev.PREEMPTION),
                                        ("TIMEOUT", ev.TIMEOUT), ("OUT_OF_MEMORY", ev.APP_ERROR)])  # fmt: skip
def test_the_accounting_state_of_the_silent_run_names_its_ending_and_blames_nobody(state, cls):
    interruption, ended = silent_end.infer_previous_outcome(silent_run(), [], None, None, [run(state)])
    assert interruption["class"] == cls and ended["outcome"]["class"] == cls
    assert interruption["blamed_nodes"] == []  # accounting does not say which node failed
    assert f"sacct: the previous run of job 7 ended {state}" in interruption["evidence"][0]
    assert "on n1,n2" in interruption["evidence"][0]


def test_a_down_node_is_still_what_blames_and_the_accounting_line_joins_the_evidence():
    interruption, _ = silent_end.infer_previous_outcome(silent_run(), ["n2"], None, None, [run("NODE_FAIL")])
    assert interruption["class"] == ev.NODE_FAILURE and interruption["blamed_nodes"] == ["n2"]
    assert any(line.startswith("sacct: ") for line in interruption["evidence"])


def test_without_accounting_nothing_changes_and_an_unexplained_state_stays_unknown():
    unknown, _ = silent_end.infer_previous_outcome(silent_run(), [], None, None, None)
    assert unknown["class"] == ev.UNKNOWN and unknown["evidence"] == [
        "the previous run ended without a word from its supervisor (killed with the job?)"]
    failed, _ = silent_end.infer_previous_outcome(silent_run(), [], None, None, [run("FAILED", exit_code=1)])
    assert failed["class"] == ev.UNKNOWN and failed["blamed_nodes"] == []
    assert "sacct: the previous run of job 7 ended FAILED, exit 1:0 on n1,n2" in failed["evidence"]


def test_the_record_is_the_silent_runs_not_the_current_one_nor_an_older_one():
    current = JobRun(job_id="7", state="RUNNING", start_time=int(STARTED + 500))
    older = run("PREEMPTED", start=STARTED - 5000)
    assert silent_end.accounted_run([older, current], "7", STARTED) is None
    mine = run("TIMEOUT")
    assert silent_end.accounted_run([older, mine, current], "7", STARTED) == mine
    assert silent_end.accounted_run([run("TIMEOUT")], "8", STARTED) is None  # another job's


def test_the_run_asks_accounting_only_for_a_silent_run_and_a_site_without_it_is_not_an_error(tmp_path):
    from supervisor.driver.context import Context
    from supervisor.driver.opening import accounting

    journal: list[dict[str, Any]] = []
    ctx = Context.of(journal.append)
    slurm = FakeSlurm(JobInfo(job_id="7", state="RUNNING", base_state="RUNNING"), ("n1",), FakeChannel("7"))

    def no_accounting(job_id: str) -> list[JobRun]:
        raise AccountingUnavailable(["sacct"], "Slurm accounting storage is disabled")

    slurm.history = no_accounting  # type: ignore[method-assign]
    assert accounting(ctx, slurm, "7") is None and journal == []

    def unreachable(job_id: str) -> list[JobRun]:
        raise SlurmUnreachable(["sacct"], "Unable to contact slurm controller", 1)

    slurm.history = unreachable  # type: ignore[method-assign]
    assert accounting(ctx, slurm, "7") is None
    assert journal[-1]["type"] == ev.SUPERVISOR_ERROR and "sacct" in journal[-1]["error"]

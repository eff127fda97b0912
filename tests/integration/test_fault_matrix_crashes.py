"""Fault matrix, crashes (issue 9 item 4): a deterministic crash at every start, a crash only on one node, a
hardware line on one node's rank. An application error blames a node only when it repeats there from other ranks
(the supervisor moves the ranks after the first one) and never elsewhere; a hardware line blames its writer's node
at once. User-style program: programs/torchsave_train.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from campaign_tools import cancel, job_state, launches, wait_for
from matrix_tools import Row, agent_pids, mark_bad_node, ranks_pids, record_time, submit_program

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]



def stops_as_a_bug(camp: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A crash at every start: relaunched twice as an app_error blaming nobody, then stopped as a bug; (the last
    interruption, the campaign's end)."""
    rows = [Row(camp, i) for i in range(3)]
    for row in rows[:2]:
        row.check("app_error", [], "restart_in_allocation")
    last = rows[2].check("app_error", [], "stop")
    ended = wait_for("the campaign to stop", camp.ended, 60)
    assert ended["state"] == "failed" and "app_error" in ended["reason"]
    return last, ended


def test_rank0_crash_at_every_start_stops_the_campaign_blaming_no_node_and_leaves_nothing_in_slurm(tmp_path):
    camp = submit_program(tmp_path, "--crash-at-start-rank", "0", steps=20)
    try:
        last, ended = stops_as_a_bug(camp)
        first = camp.of_type("interruption")[0]
        record_time("crash at every start", stopped_s=ended["t"] - first["t"])
        # Rank 0 crashed on node A, then (ranks moved) on node B: it follows the rank, no node is the cause.
        assert [launch["resume_step"] for launch in launches(camp)] == [None, None, None]
        assert len({tuple(e["origin_nodes"]) for e in camp.of_type("interruption")}) == 2
        assert all(e["origin_ranks"] == [0] for e in camp.of_type("interruption")), camp.of_type("interruption")
        assert "requeue" not in [e["kind"] for e in camp.of_type("action")] and last["blamed_nodes"] == []
        state = wait_for("the job to end", lambda: (s := job_state(camp.job_id) or ("GONE", 0))[0]
                         not in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED") and s, 60)  # fmt: skip
        assert state[1] == 0, state  # never requeued
        wait_for("no rank or agent left", lambda: not ranks_pids(camp) and not agent_pids(camp), 30)
        assert camp.report()["excluded_nodes"] == []
    finally:
        cancel(camp.job_id)


def test_a_device_side_assert_at_every_start_is_a_bug_not_hardware(tmp_path):
    """Rank 1 fails its first step at every start as torch does on a CUDA kernel's assert (an index out of range in
    the user's code; the words are torch's, captured on an H200). It used to be `hardware` with the node struck
    for good at each launch until the hardware budget ran out; it is the program's `app_error`, nobody blamed or
    excluded, and the campaign stops as for any bug (docs/decisions.md, "Hardware needs hardware evidence")."""
    camp = submit_program(tmp_path, "--cuda-assert-rank", "1", steps=20)
    try:
        last, ended = stops_as_a_bug(camp)
        interruptions = camp.of_type("interruption")
        assert all(e["class"] == "app_error" and e["blamed_nodes"] == [] for e in interruptions), interruptions
        assert all(e["origin_ranks"] == [1] for e in interruptions), interruptions
        assert any("device-side assert triggered" in line for line in last["evidence"]), last["evidence"]
        assert not [e for e in camp.of_type("action") if e["kind"] in ("drain", "requeue")]
        assert camp.report()["excluded_nodes"] == []
        first = interruptions[0]
        record_time("device-side assert at every start", stopped_s=ended["t"] - first["t"])
        wait_for("no rank or agent left", lambda: not ranks_pids(camp) and not agent_pids(camp), 30)
    finally:
        cancel(camp.job_id)


def test_a_crash_only_on_one_node_blames_it_once_it_repeats_there_from_other_ranks(tmp_path):
    camp = submit_program(tmp_path, "--crash-on-bad-node", "3", steps=12, ckpt_every=2)
    try:
        bad = mark_bad_node(camp, 1)  # rank 1 there at the first launch; rank 0 after the ranks move
        first = Row(camp, 0)
        first.check("app_error", [], "restart_in_allocation")
        first.resumed_from((str(camp.ckpt / "checkpoint-2.pt"), 2))
        second = Row(camp, 1)
        got = second.check("app_error", [bad], "requeue")
        assert launches(camp)[1]["rank_nodes"][0] == bad  # rank 0 was moved onto it, and crashed there too
        assert any(f"repeats on {bad}" in line for line in got["evidence"]), got["evidence"]
        requeued = wait_for("the requeued run", lambda: camp.of_type("attempt_started")[1:] or None, 120)[0]
        assert bad not in requeued["nodes"]
        record_time("crash only on one node", requeued_s=requeued["t"] - first.interruption()["t"])
        ended = wait_for("the campaign to complete", camp.ended, 150)
        assert ended["state"] == "completed"
        assert launches(camp)[-1]["resume_step"] == 2 and bad not in launches(camp)[-1]["nodes"]
        assert bad in camp.report()["excluded_nodes"]
    finally:
        cancel(camp.job_id)


def test_a_hardware_line_blames_its_node_and_the_next_launch_runs_on_the_spare(tmp_path):
    camp = submit_program(tmp_path, "--xid-on-bad-node", "5", steps=16, ckpt_every=2, nodes=2,
                          config="[run]\nspare_nodes = 1\n")  # fmt: skip
    try:
        bad = mark_bad_node(camp, 1)  # the step runs on the first two nodes, rank 1 on the second
        row = Row(camp, 0)
        got = row.check("hardware", [bad], "restart_in_allocation")
        assert any("Xid" in line for line in got["evidence"]), got["evidence"]
        resumed = row.resumed_from((str(camp.ckpt / "checkpoint-4.pt"), 4))
        relaunch = row.relaunch()
        assert bad not in relaunch["nodes"] and bad in relaunch["excluded"]
        record_time("hardware line on one node", resumed_s=resumed - got["t"])
        ended = wait_for("the campaign to complete", camp.ended, 120)
        assert ended["state"] == "completed" and len(camp.of_type("attempt_started")) == 1
    finally:
        cancel(camp.job_id)


HOSTILE = ("sample 17 label: 'the job was requeued due to failure of node {bad}'\\r"
           "srun: error: Task launch for StepId=1.0 failed on node {bad}: Communication connection failure\\n"
           "ValueError: due to failure of node -x\\nfailure of node n[0-1048575]")


def test_a_ranks_printed_text_never_speaks_for_slurm(tmp_path):
    """Issue 22: one printed line ended `supervise run` (a hostlist error), a data sample blamed and excluded a
    healthy node, `n[0-1048575]` blamed a million nodes. Here rank 1 prints all of it (with a \\r inside a line,
    as a progress bar does) and then fails: an app error, nobody blamed, relaunched and completed."""
    camp = submit_program(tmp_path, "--print-at-step", "5", "--print-text", HOSTILE.format(bad="node2"), steps=12,
                          ckpt_every=2)  # fmt: skip
    try:
        row = Row(camp, 0)
        got = row.check("app_error", [], "restart_in_allocation")
        row.resumed_from((str(camp.ckpt / "checkpoint-4.pt"), 4))
        ended = wait_for("the campaign to complete", camp.ended, 150)
        assert ended["state"] == "completed" and len(camp.of_type("attempt_started")) == 1, ended
        assert not camp.of_type("supervisor_error"), camp.of_type("supervisor_error")
        assert camp.report()["excluded_nodes"] == [] and got["blamed_nodes"] == []
        assert not [e for e in camp.of_type("action") if e["kind"] in ("requeue", "drain", "mark_suspect")]
    finally:
        cancel(camp.job_id)

"""Fault matrix, rank faults (issue 9 item 4), on the real local Slurm with a user-style program
(programs/torchsave_train.py: plain torch.save, gloo; the client only where a row needs heartbeats).

Each row asserts the class, the blamed nodes, the action, the campaign's end state, and that the relaunch resumed
from the newest checkpoint valid before the fault. Rows share a campaign where that stays clear.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
from campaign_tools import cancel, launches, wait_for
from matrix_tools import (
    Row,
    agent_pids,
    newest_valid,
    printed_step,
    rank_pid_on,
    record_time,
    submit_program,
    wait_printed,
)

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_rank_sigkill_then_rank_sigstop_restart_in_allocation_from_the_newest_checkpoint(tmp_path):
    """No client: the agents see the killed rank vanish and the stopped one in state T."""
    camp = submit_program(tmp_path, steps=45)
    try:
        # Row: rank SIGKILL (an outside kill, e.g. the OOM killer): nobody blamed, relaunched in the allocation.
        wait_printed(camp, 1, 23)
        before = newest_valid(camp.ckpt)
        assert before is not None and before[1] == 20
        t0 = time.time()
        os.kill(rank_pid_on(camp, 1), signal.SIGKILL)
        kill = Row(camp, 0)
        got = kill.check("unknown", [], "restart_in_allocation")
        assert any("rank 1" in line and "SIGKILL" in line for line in got["evidence"]), got["evidence"]
        resumed = kill.resumed_from(before)
        record_time("rank SIGKILL", detected_s=got["t"] - t0, resumed_s=resumed - t0)

        # Row: rank SIGSTOP: a hang (state T), stacks saved, the step killed and relaunched in the allocation.
        wait_printed(camp, 2, 33)
        before = newest_valid(camp.ckpt)
        assert before is not None and before[1] == 30
        t0 = time.time()
        os.kill(rank_pid_on(camp, 0), signal.SIGSTOP)
        stop = Row(camp, 1)
        got = stop.check("hang", [kill.relaunch()["nodes"][0]], "restart_in_allocation")
        assert got["t"] - t0 < 3 * 5 + 5  # within 3x the learned step timeout (5 s floor) and a few seconds
        assert "kill_step" in stop.actions()
        # Both ranks lack the client: py-spy saved each one's stack before the kill, the stopped one read with
        # --nonblocking (left stopped), the peer waiting in its collective.
        stacks = camp.of_type("stacks")
        assert {s["rank"] for s in stacks if s["result"] == "stacks_saved"} == {0, 1}, stacks
        assert any(s["rank"] == 0 and s["detail"].endswith(".pyspy.txt") for s in stacks), stacks
        assert camp.report()["attempts"][1]["stacks"]["without_stack"] == []  # the SIGSTOP launch
        resumed = stop.resumed_from(before)
        record_time("rank SIGSTOP", detected_s=got["t"] - t0, resumed_s=resumed - t0)

        ended = wait_for("the campaign to complete", camp.ended, 180)
        assert ended["state"] == "completed"
        report = camp.report()
        assert [a["outcome"]["class"] for a in report["attempts"]] == ["unknown", "hang", "completed"]
        assert len({a["job_id"] for a in report["attempts"]}) == 1 and report["excluded_nodes"] == []
        assert len(launches(camp)) == 3
    finally:
        cancel(camp.job_id)


def test_hang_in_a_program_without_the_client_ends_at_its_own_collective_timeout(tmp_path):
    """What the supervisor cannot see: a rank blocked but alive (sleeping, not stopped) in a program that never
    calls the client gives no heartbeat to miss and no process state to read. The run stalls until the
    program's own collective timeout (gloo's, 15 s here; 30 min by default) fails the peer; that failure is
    classified (a gloo timeout: comm_error, a loopback address names no node) and the step relaunched."""
    camp = submit_program(tmp_path, "--hang-at-step", "14", "--hang-rank", "1", "--pg-timeout", "15", steps=30)
    try:
        wait_printed(camp, 1, 14)
        t0 = time.time()
        before = newest_valid(camp.ckpt)
        assert before is not None and before[1] == 10
        row = Row(camp, 0)
        got = row.check("comm_error", [], "restart_in_allocation")
        assert got["t"] - t0 >= 10  # nothing seen before the program's own timeout
        assert any("Timed out" in line or "timed out" in line for line in got["evidence"]), got["evidence"]
        resumed = row.resumed_from(before)
        record_time("hang without client", detected_s=got["t"] - t0, resumed_s=resumed - t0)
        ended = wait_for("the campaign to complete", camp.ended, 120)
        assert ended["state"] == "completed" and camp.report()["excluded_nodes"] == []
    finally:
        cancel(camp.job_id)


def test_client_program_live_hang_relaunches_loss_spike_warns_nan_rolls_back_then_stops(tmp_path):
    """The rows that need heartbeats, in one campaign of a program using the client: a live hang (rank 1 sleeps
    after its step: no heartbeat, process alive; named from the stacks), a loss spike (a warning: L2 alert, the run
    goes on), then NaN: rolled back twice from before the divergence, with the steps to skip named (this program
    does not skip them, and its loss is NaN from step 56 whatever the weights), then the campaign stops without a
    checkpoint of the diverged state."""
    config = ("[run]\nsummary_interval_s = 0.25\nloop_interval_s = 0.25\n"
              "[detect]\nloss_min_samples = 8\nwarmup_samples = 10\n")  # learned in ~5 steps, even under load
    camp = submit_program(tmp_path, "--client", "--hang-at-step", "24", "--hang-rank", "1", "--spike-at-step",
                          "40", "--nan-at-step", "56", steps=90, config=config)  # fmt: skip
    try:
        # Row: live hang with the client. Rank 0 waits for rank 1 in the next step's all-reduce, so both are
        # silent at step 24, past their own step timeout; their stacks (asked for at once, the client's dumps)
        # show rank 0 waiting inside DDP's backward and rank 1 elsewhere: rank 1 is named, not a global stall.
        wait_printed(camp, 1, 24)
        t0 = time.time()
        before = newest_valid(camp.ckpt)
        assert before is not None and before[1] == 20
        hang = Row(camp, 0)
        rank1_node = launches(camp)[0]["nodes"][1]
        got = hang.check("hang", [rank1_node], "restart_in_allocation")
        named = [e for e in camp.of_type("detection") if e["kind"] == "rank_hang"]
        assert named and named[0]["ranks"] == [1], camp.of_type("detection")
        assert any("rank 1 is not waiting for its peers" in line for line in named[0]["evidence"])
        assert not [e for e in camp.of_type("detection") if e["kind"] == "global_stall"]
        assert {"dump_stacks", "kill_step"} <= set(hang.actions())
        stacks = {(e["rank"], e["result"]) for e in camp.of_type("stacks")}
        assert {(0, "stacks_saved"), (1, "stacks_saved")} <= stacks
        resumed = hang.resumed_from(before)
        record_time("live hang with client", detected_s=got["t"] - t0, resumed_s=resumed - t0)

        # Row: loss spike: detected on rank 0, an L2 alert, no interruption.
        spike = wait_for("the loss spike", lambda: [e for e in camp.of_type("detection")
                                                    if e["kind"] == "loss_spike"], 60)[0]  # fmt: skip
        alert = wait_for("its alert", lambda: [e for e in camp.of_type("action")
                                               if e["kind"] == "alert" and e["t"] >= spike["t"]], 20)[0]  # fmt: skip
        assert alert["tier"] == "L2" and len(camp.of_type("interruption")) == 1

        # Row: NaN: numerical, nobody blamed, rolled back (twice: the budget), then stopped; checkpoints after
        # the last finite loss quarantined.
        wait_printed(camp, 2, 56, timeout=60)
        t0 = time.time()
        nan = Row(camp, 1)
        got = nan.check("numerical", [], "restart_in_allocation")
        record_time("NaN", detected_s=max(0.0, got["t"] - t0))
        rolled = nan.relaunch()
        assert rolled["resume_step"] is not None and rolled["resume_step"] < 56, rolled
        assert rolled["skip_steps"][0] == rolled["resume_step"] + 1 and rolled["skip_steps"][1] >= 56, rolled
        ended = wait_for("the campaign to stop", camp.ended, 120)
        assert ended["state"] == "failed" and "NaN" in ended["reason"]
        # Three NaNs without progress stop it (the budget's two roll backs); one more when the step-50 checkpoint
        # was only seen after the first NaN (a busy machine): that sighting is progress and restarts the count.
        nans = [i["class"] for i in camp.of_type("interruption")[1:]]
        assert set(nans) == {"numerical"} and 3 <= len(nans) <= 4, nans
        assert len(launches(camp)) == 1 + len(nans) and camp.of_type("checkpoint_requested") == []
        after = newest_valid(camp.ckpt)
        assert after is not None and after[1] < 56
        assert all("diverged" in e["reason"] for e in camp.of_type("checkpoint_quarantined"))
        assert camp.report()["excluded_nodes"] == []
    finally:
        cancel(camp.job_id)


def test_a_rank_stuck_on_the_way_to_a_collective_save_is_named_within_its_own_step_timeout(tmp_path):
    """Issue 26: a user's program marks its save with ``client.phase("checkpoint")``; at step 20 rank 1 stops on
    the way to the save while rank 0 enters it and waits in the save's barrier. Rank 0's checkpoint allowance is
    600 s here; rank 1's own step timeout (learned, seconds) decides: its stacks show it outside any collective,
    rank 0 waiting inside one, and rank 1 is named long before the allowance (it once took the allowance and then
    named nobody)."""
    config = ("[run]\nsummary_interval_s = 0.25\nloop_interval_s = 0.25\n"
              "[detect]\nwarmup_samples = 10\ncheckpoint_allowance_s = 600.0\n")  # fmt: skip
    camp = submit_program(tmp_path, "--client", "--save-phase", "--hang-before-save", "20", "--hang-rank", "1",
                          steps=40, config=config)  # fmt: skip
    try:
        wait_printed(camp, 1, 20)
        t0 = time.time()
        row = Row(camp, 0)
        rank1_node = launches(camp)[0]["nodes"][1]
        got = row.check("hang", [rank1_node], "restart_in_allocation")
        before = newest_valid(camp.ckpt)  # rank 0 saved step 20 before it waited in the barrier
        assert before is not None and before[1] == 20, before
        named = [e for e in camp.of_type("detection") if e["kind"] == "rank_hang"]
        assert named and named[0]["ranks"] == [1], camp.of_type("detection")
        assert named[0]["t"] - t0 < 120, (named[0]["t"] - t0, named)  # its own step timeout, not the 600 s
        assert not [e for e in camp.of_type("detection") if e["kind"] == "global_stall"]
        resumed = row.resumed_from(before)
        record_time("rank stuck before a collective save", detected_s=got["t"] - t0, resumed_s=resumed - t0)
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
    finally:
        cancel(camp.job_id)


def test_every_agent_silenced_at_once_blames_no_node_and_relaunches(tmp_path):
    """All node agents stop answering together (SIGSTOP: the supervisor's network, or the agents' step, failed):
    far likelier our side than every node at once. Class unknown, nobody blamed or excluded, relaunched."""
    camp = submit_program(tmp_path, steps=80)
    agents: list[int] = []
    try:
        wait_printed(camp, 1, 13)
        before = newest_valid(camp.ckpt)
        assert before is not None and before[1] == 10
        agents = agent_pids(camp)
        assert len(agents) == 2, agents
        t0 = time.time()
        for pid in agents:
            os.kill(pid, signal.SIGSTOP)
        row = Row(camp, 0)
        got = row.check("unknown", [], "restart_in_allocation")
        for pid in agents:
            os.kill(pid, signal.SIGCONT)
        assert any("all 2 node agents are silent" in line for line in got["evidence"]), got["evidence"]
        resumed = row.resumed_from(newest_valid(camp.ckpt) or before)
        record_time("every agent silenced", detected_s=got["t"] - t0, resumed_s=resumed - t0)
        ended = wait_for("the campaign to complete", camp.ended, 120)
        assert ended["state"] == "completed" and camp.report()["excluded_nodes"] == []
    finally:
        for pid in agents:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        cancel(camp.job_id)


def test_a_persistent_straggler_is_flagged_and_its_node_struck(tmp_path):
    """From step 25 on, rank 2's forward pass takes 0.4 s longer (a slow GPU); the peers wait for it in DDP's
    gradient all-reduce, so every rank steps at its pace. The program calls ``client.watch_ddp(model)`` once:
    each rank's own time (step time less that wait) names rank 2; an L2 alert and a strike on its node, and
    training goes on. Steps 1-24 (three ranks on the loaded machine, nobody slow) are the control: no straggler."""
    config = "[run]\nsummary_interval_s = 0.25\n[detect]\nstraggler_consecutive = 2\nstraggler_interval_s = 2\n"
    camp = submit_program(tmp_path, "--client", "--slow-rank", "2", "--slow-s", "0.4", "--slow-from-step", "25",
                          steps=200, nodes=3, config=config)  # fmt: skip
    try:
        wait_printed(camp, 1, 24)
        t0 = time.time()
        assert not [e for e in camp.of_type("detection") if e["kind"] == "straggler"]  # >= 7 s of checks so far
        measured = [r["rank"] for r in camp.live().get("ranks", []) if r.get("own_s")]
        assert sorted(measured) == [0, 1, 2], camp.live()  # every rank reports its own time
        # The slow steps' own times fill the EWMA within a few steps; then straggler_consecutive checks
        # straggler_interval_s apart, plus the loop's passes, on a machine whose steps may run 3x slow.
        found = wait_for("a straggler detection", lambda: [e for e in camp.of_type("detection")
                                                           if e["kind"] == "straggler"], 3 * 2 * 2 + 20)[0]  # fmt: skip
        assert found["ranks"] == [2] and found["metric"] == "own_ewma_s", found
        assert "own time per step" in found["evidence"][0], found["evidence"]
        strike = wait_for("the strike", lambda: [e for e in camp.of_type("action")
                                                 if e["kind"] == "mark_suspect"], 20)[0]  # fmt: skip
        assert strike["target"] == found["nodes"] and not camp.of_type("interruption")
        alert = [e for e in camp.of_type("action") if e["kind"] == "alert" and e["t"] >= found["t"]]
        assert alert and alert[0]["tier"] == "L2" and alert[0]["target"] == found["nodes"], alert
        record_time("persistent straggler", detected_s=found["t"] - t0)
        before = printed_step(camp, 1)
        wait_printed(camp, 1, before + 10, timeout=60)  # training goes on, in the same launch
        assert not camp.of_type("interruption") and len(launches(camp)) == 1
        assert {r for e in camp.of_type("detection") if e["kind"] == "straggler" for r in e["ranks"]} == {2}
    finally:
        cancel(camp.job_id)

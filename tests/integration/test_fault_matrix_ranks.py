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
from matrix_tools import Row, newest_valid, rank_pid_on, record_time, submit_program, wait_printed

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_rank_sigkill_then_rank_sigstop_restart_in_allocation_from_the_newest_checkpoint(tmp_path):
    """No client: the agents see the killed rank vanish and the stopped one in state T."""
    camp = submit_program(tmp_path, steps=70)
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
        assert "kill_step" in stop.actions()
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

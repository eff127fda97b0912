"""Stopping is the user's right (issue 9 item 6), on the real local Slurm: `scancel` of a job without a time
limit (no --time; the partition's MaxTime is INFINITE) is `cancelled` and final, and `supervise cancel
--checkpoint` saves first, then stops the campaign for good. Nothing is requeued; no rank is left running."""

from __future__ import annotations

import pytest
from campaign_tools import cancel, job_state, launches, rank_pid, submit, supervise, wait_for

pytest.importorskip("torch")
START_TIMEOUT = 150  # job scheduled, agents up, 2 ranks import torch and build the process group (2 shared cores)


def _is_training(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"train_ddp" in f.read()
    except OSError:
        return False


pytestmark = [pytest.mark.slurm, pytest.mark.torch]



def test_scancel_of_a_job_without_a_time_limit_is_cancelled_and_final(tmp_path):
    camp = submit(tmp_path, steps=400, step_time=0.3, sbatch=())  # no --time: MaxTime=INFINITE
    try:
        pids = [wait_for(f"rank {r} to train", lambda r=r: rank_pid(camp, r, min_step=5), START_TIMEOUT)
                for r in (0, 1)]  # fmt: skip
        cancel(camp.job_id)
        ended = wait_for("the campaign to end", camp.ended, 60)
        assert ended["state"] == "stopped"
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "cancelled" and interruption["blamed_nodes"] == []
        assert not [e for e in camp.of_type("action") if e["kind"] in ("requeue", "hold", "await_requeue")]
        wait_for("every rank to be gone", lambda: not any(_is_training(p) for p in pids), 30)
        state = wait_for("the job to leave RUNNING", lambda: (job_state(camp.job_id) or ("GONE", 0))
                         if (job_state(camp.job_id) or ("GONE",))[0] not in ("RUNNING", "COMPLETING") else None, 60)
        assert state[0] in ("CANCELLED", "GONE") and state[1] == 0  # never requeued
        assert len(launches(camp)) == 1 and len(camp.of_type("attempt_started")) == 1
    finally:
        cancel(camp.job_id)


def test_supervise_cancel_with_checkpoint_saves_then_stops_for_good(tmp_path):
    camp = submit(tmp_path, steps=2000, step_time=0.2, ckpt_every=0, sbatch=())
    try:
        pids = [wait_for(f"rank {r} to train", lambda r=r: rank_pid(camp, r, min_step=5), START_TIMEOUT)
                for r in (0, 1)]  # fmt: skip
        out = supervise("cancel", str(camp.root), "--checkpoint")
        assert "stopped: cancelled by the user" in out.stdout and "checkpoint saved at step" in out.stdout
        ended = camp.ended()
        assert ended is not None and ended["state"] == "stopped" and ended["reason"] == "cancelled by the user"
        report = camp.report()
        assert report["state"] == "stopped" and report["reason"] == "cancelled by the user"
        assert report["attempts"][0]["outcome"]["class"] == "cancelled"
        assert camp.of_type("checkpoint_committed") and not camp.of_type("checkpoint_missed")
        wait_for("every rank to be gone", lambda: not any(_is_training(p) for p in pids), 30)
        wait_for("the job to end", lambda: (job_state(camp.job_id) or ("GONE", 0))[0]
                 not in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED"), 60)
        state = job_state(camp.job_id)
        assert state is None or state[1] == 0  # never requeued
        again = supervise("cancel", str(camp.root))
        assert "already ended" in again.stdout
    finally:
        cancel(camp.job_id)


"""The supervisor loop on the real local Slurm: real ranks hung, killed, preempted, timed out and diverged.

Each test submits the example training with `supervise submit`, injects one fault into the real processes or
the real Slurm, and asserts what a user relies on: the class the report gives, how fast and how the run
recovered (in the allocation or by requeue), that it resumed from a checkpoint, and that no one was blamed
when no one was at fault.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest
from campaign_tools import Campaign, cancel, launches, rank_pid, submit, supervise, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 150  # job scheduled, agents up, 2 ranks import torch and build the process group (2 shared cores)


def _is_training(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"train_ddp" in f.read()
    except OSError:
        return False


def outcomes(report: dict) -> list[str]:
    return [a["outcome"]["class"] if a["outcome"] else "running" for a in report["attempts"]]


def test_hung_rank_is_detected_stacks_saved_and_step_restarted_in_allocation(tmp_path):
    camp = submit(tmp_path, steps=70, step_time=0.3)
    try:
        pid = wait_for("rank 1 to train", lambda: rank_pid(camp, 1, min_step=15), START_TIMEOUT)
        stopped_at = time.time()
        os.kill(pid, signal.SIGSTOP)
        second = wait_for("a relaunch", lambda: launches(camp)[1:] or None, 60)[0]
        detection = next(e for e in camp.of_type("detection") if e["kind"] in ("rank_stopped", "rank_hang"))
        # Learned step timeout is at least its 5 s floor here; the bound is 3x it plus a few seconds.
        assert detection["t"] - stopped_at < 3 * 5 + 5
        assert second["t"] - stopped_at < 3 * 5 + 10
        assert second["excluded"] == []  # no spare nodes: the hang's node is only a soft suspect
        stacks = camp.of_type("stacks")
        assert any(s["result"] == "stacks_saved" for s in stacks)  # the peer's stack, waiting in a collective
        # the stopped rank itself: py-spy --nonblocking reads it without resuming it (Python frames)
        assert any(s["result"] == "stacks_saved" and s["rank"] == 1 and s["detail"].endswith(".pyspy.txt")
                   for s in stacks), stacks  # fmt: skip
        saved = sorted(p.name for p in (camp.root / "stacks").iterdir())
        assert any(name.startswith(("node", "n")) and "rank0" in name for name in saved), saved
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed"
        report = camp.report()
        assert outcomes(report) == ["hang", "completed"]
        assert report["attempts"][1]["resume_from"]  # resumed from a checkpoint, not from scratch
        assert report["attempts"][0]["job_id"] == report["attempts"][1]["job_id"]  # same allocation
    finally:
        cancel(camp.job_id)


def test_killed_rank_is_restarted_in_allocation_from_the_newest_checkpoint(tmp_path):
    camp = submit(tmp_path, steps=60, step_time=0.3)
    try:
        pid = wait_for("rank 0 past a checkpoint", lambda: rank_pid(camp, 0, min_step=22), START_TIMEOUT)
        os.kill(pid, signal.SIGKILL)
        wait_for("a relaunch", lambda: launches(camp)[1:] or None, 60)
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed"
        report = camp.report()
        first, second = report["attempts"][:2]
        assert first["outcome"]["class"] not in ("completed", "preemption", "timeout")
        assert second["resume_step"] and second["resume_step"] >= 20
        assert first["job_id"] == second["job_id"] and first["restart"] == second["restart"] == 0
    finally:
        cancel(camp.job_id)


def test_time_limit_checkpoints_then_requeues_without_blame(tmp_path):
    # --time=1 with a 45 s lead: Slurm sends USR1 to the batch step within seconds of the start.
    camp = submit(tmp_path, steps=2000, step_time=0.2, ckpt_every=0, sbatch=("--time=1",),
                  config="[submit]\nsignal_lead_s = 45\n")  # fmt: skip
    try:
        second = wait_for("the requeued run", lambda: camp.of_type("attempt_started")[1:] or None, 200)[0]
        assert second["restart"] == 1
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "timeout" and interruption["blamed_nodes"] == []
        assert any(e["kind"] == "requeue" for e in camp.of_type("action"))
        # The ranks saved on request before the requeue (periodic checkpoints are off), and the next run resumed.
        relaunch = wait_for("the relaunch", lambda: launches(camp)[1:] or None, 60)[0]
        assert relaunch["resume_from"] and relaunch["resume_step"] > 0
    finally:
        cancel(camp.job_id)


def test_preemption_checkpoints_and_lets_slurm_requeue_without_blame(tmp_path, slurm_cluster):
    camp = submit(tmp_path, steps=90, step_time=0.3, ckpt_every=0)
    urgent = None
    try:
        wait_for("rank 0 to train", lambda: rank_pid(camp, 0, min_step=10), START_TIMEOUT)
        out = slurm_cluster.slurm("sbatch", "--parsable", "-p", "urgent", "-N", "4", "--exclusive", "--time=1",
                                  "-o", "/dev/null", "--wrap", "sleep 10")  # fmt: skip
        urgent = out.stdout.strip().split(";")[0]
        wait_for("the preemption", lambda: camp.of_type("interruption") or None, 60)
        ended = wait_for("the campaign to complete after the requeue", camp.ended, 300)
        assert ended["state"] == "completed"
        report = camp.report()
        first = report["attempts"][0]
        assert first["outcome"]["class"] == "preemption"
        assert first["outcome"]["blamed_nodes"] == [] and report["excluded_nodes"] == []
        later = report["attempts"][1]
        assert later["restart"] == 1 and later["resume_step"] and later["resume_step"] >= first["last_step"] - 1
    finally:
        cancel(camp.job_id)
        if urgent:
            cancel(urgent)


def test_nan_loss_stops_the_campaign_with_a_clear_message_and_keeps_good_checkpoints(tmp_path):
    # NaN from step 12, checkpoints at every step: the ones written between the NaN and its detection (about a
    # second) must not be resumed from, and the supervisor never asks for a checkpoint of the NaN state itself.
    camp = submit(tmp_path, steps=200, step_time=0.3, ckpt_every=1,
                  train=("--nan-at-step", "12", "--keep-last", "100"))
    try:
        ended = wait_for("the campaign to stop", camp.ended, START_TIMEOUT + 60)
        assert ended["state"] == "failed"
        assert "NaN" in ended["reason"] and "resubmit" in ended["reason"]
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "numerical"
        alert = next(e for e in camp.of_type("action") if e["kind"] == "alert")
        assert alert["tier"] in ("L3", "L4")
        assert len(launches(camp)) == 1  # never restarted
        assert camp.of_type("checkpoint_requested") == []
        # No checkpoint of the NaN state was requested: the newest valid one predates the divergence.
        from supervisor.checkpoint.store import CheckpointStore

        newest = CheckpointStore(camp.ckpt).newest_valid(full=True, quarantine=False)
        assert newest is not None and newest.step is not None and newest.step < 12
        moved = camp.of_type("checkpoint_quarantined")
        assert moved and all("diverged" in e["reason"] for e in moved)
        assert any("step_000000012" in e["path"] or "step_000000013" in e["path"] for e in moved)
    finally:
        cancel(camp.job_id)


def test_scancel_stops_the_campaign_as_cancelled_and_leaves_no_rank_behind(tmp_path):
    camp = submit(tmp_path, steps=400, step_time=0.3)
    try:
        pids = [wait_for(f"rank {r} to train", lambda r=r: rank_pid(camp, r, min_step=5), START_TIMEOUT)
                for r in (0, 1)]  # fmt: skip
        cancel(camp.job_id)
        ended = wait_for("the campaign to end", camp.ended, 60)
        assert ended["state"] == "stopped"
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "cancelled" and interruption["blamed_nodes"] == []
        assert len(launches(camp)) == 1  # a cancel is never restarted
        wait_for("every rank to be gone", lambda: not any(_is_training(p) for p in pids), 30)
    finally:
        cancel(camp.job_id)


def test_ranks_without_the_client_are_still_watched_a_stopped_one_is_a_hang(tmp_path):
    root = tmp_path / "campaign"
    program = "import time\nfor _ in range(3000):\n    time.sleep(0.1)\n"
    out = supervise("submit", "--nodes=2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--",
                    sys.executable, "-c", program)  # fmt: skip
    job_id = out.stdout.split()[1]
    camp = Campaign(job_id, root, tmp_path / "none")
    try:
        row = wait_for("the slot-less rank 1 in the live table",
                       lambda: next((r for r in camp.live().get("ranks", []) if r["rank"] == 1
                                     and r["state"] in ("sleeping", "running")), None), START_TIMEOUT)  # fmt: skip
        assert row["beat_age_s"] is None  # no heartbeats: it never calls the client
        os.kill(int(row["pid"]), signal.SIGSTOP)
        relaunch = wait_for("a relaunch", lambda: launches(camp)[1:] or None, 60)[0]
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "hang" and relaunch["launch"] == 2
        # both ranks lack the client: py-spy saved each one's stack before the kill (the stopped one left stopped)
        saved = {s["rank"] for s in camp.of_type("stacks") if s["result"] == "stacks_saved"}
        assert saved == {0, 1}, camp.of_type("stacks")
        assert camp.report()["attempts"][0]["stacks"]["without_stack"] == []
    finally:
        cancel(job_id)

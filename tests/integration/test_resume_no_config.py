"""A campaign submitted exactly as README's usage shows (no config file, the checkpoint directory named only by
the training command's --ckpt-dir) resumes from its newest valid checkpoint after a fault, not from step 0.

Before issue 9 item 1 the supervisor knew no checkpoint directory here and exported SUPERVISOR_RESUME_FROM=""
("fresh start"), so every relaunch trained from step 0.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import pytest
from campaign_tools import EXAMPLE, Campaign, cancel, launches, rank_pid, supervise, wait_for

from supervisor.decisions.tasklog import strip_label

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 150  # job scheduled, agents up, 2 ranks import torch and build the process group (2 shared cores)



def resumed_line(relaunch: dict) -> str:
    """What the program prints when it resumed as the launch says: from the memory tier (on by default, issue 27:
    the newest snapshot, newer than the filesystem checkpoint that stays the fallback in ``resume_from``) or from
    the checkpoint directory."""
    if relaunch.get("resume_tier") == "memory":
        return f"resumed from memory at step {relaunch['resume_step']}"
    return f"resumed from {relaunch['resume_from']} at step {relaunch['resume_step']}"

def test_readme_usage_without_config_resumes_from_the_newest_checkpoint(tmp_path):
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    out = supervise("submit", "-N", "2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--",
                    sys.executable, str(EXAMPLE), "--steps", "60", "--ckpt-dir", str(ckpt), "--ckpt-every", "10",
                    "--step-time", "0.3", "--seed", "3")
    assert "resume is off" not in out.stderr
    camp = Campaign(out.stdout.split()[1], root, ckpt)
    try:
        spec = json.loads((root / "campaign.json").read_text())
        assert spec["config"]["run"]["checkpoint_dir"] == str(ckpt)
        # Rank 0 past step 22: the checkpoint of step 20 is committed (the save is synchronous, every 10 steps).
        pid = wait_for("rank 0 past a checkpoint", lambda: rank_pid(camp, 0, min_step=22), START_TIMEOUT)
        saved = sorted(p for p in ckpt.iterdir() if p.name.startswith("step_"))
        assert saved
        # Saved under supervision: the manifest is authenticated with the campaign's key (docs/security.md).
        assert json.loads((saved[-1] / "manifest.json").read_text())["auth"]["alg"] == "hmac-sha256"
        before = len(launches(camp))
        os.kill(pid, signal.SIGKILL)
        relaunch = wait_for("a relaunch", lambda: launches(camp)[before:] or None, 90)[0]
        assert relaunch["resume_step"] is not None and relaunch["resume_step"] >= 20
        assert relaunch["resume_from"].startswith(str(ckpt))
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed"
        log2 = next(root.glob(f"logs/*/train-{relaunch['launch']}.log")).read_text(errors="replace")
        assert resumed_line(relaunch) in log2
        lines = [strip_label(line) for line in log2.splitlines()]  # srun --label: "0: step=..."
        first_step = next(int(line.split()[0][5:]) for line in lines if line.startswith("step="))
        assert first_step == relaunch["resume_step"] + 1  # not step 1
    finally:
        cancel(camp.job_id)


def test_a_wrapper_script_resumes_because_the_programs_saver_says_where_it_saves(tmp_path):
    """Issue 27: launched through a wrapper script (``bash train.sh``: no --ckpt-dir in the command), submit says
    resume is off until the program says where it saves; examples/train_ddp.py's CheckpointSaver does
    (``client.saves_to``), the supervisor adopts that directory (journaled once), and after a rank is killed the
    relaunch resumes from the newest valid checkpoint there, not from step 0."""
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    wrapper = tmp_path / "train.sh"
    wrapper.write_text(f"#!/bin/bash\nexec {sys.executable} {EXAMPLE} --steps 60 --ckpt-dir {ckpt} "
                       "--ckpt-every 10 --step-time 0.3 --seed 3\n")  # fmt: skip
    out = supervise("submit", "-N", "2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--",
                    "bash", str(wrapper))  # fmt: skip
    assert "resume is off until the program says where it saves" in out.stderr
    camp = Campaign(out.stdout.split()[1], root, ckpt)
    try:
        pid = wait_for("rank 0 past a checkpoint", lambda: rank_pid(camp, 0, min_step=22), START_TIMEOUT)
        declared = wait_for("the declared directory", lambda: camp.of_type("checkpoint_dir_declared"), 30)
        assert [e["path"] for e in declared] == [str(ckpt)]
        before = len(launches(camp))
        os.kill(pid, signal.SIGKILL)
        relaunch = wait_for("a relaunch", lambda: launches(camp)[before:] or None, 90)[0]
        assert relaunch["resume_step"] is not None and relaunch["resume_step"] >= 20, relaunch
        assert relaunch["resume_from"].startswith(str(ckpt))
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed"
        log2 = next(root.glob(f"logs/*/train-{relaunch['launch']}.log")).read_text(errors="replace")
        assert resumed_line(relaunch) in log2
        assert len(camp.of_type("checkpoint_dir_declared")) == 1
    finally:
        cancel(camp.job_id)

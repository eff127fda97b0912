"""PyTorch Lightning under the supervisor (examples/train_lightning.py: CPU, 2 nodes, DDP over gloo): a killed
rank is relaunched in the allocation and the run continues from the step of the newest `.ckpt` Lightning saved;
Lightning's own SLURM auto-requeue is off (the supervisor owns requeue)."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from campaign_tools import REPO, Campaign, cancel, launches, live_rank, step_lines, supervise, wait_for

pytest.importorskip("torch")
pytest.importorskip("lightning")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

EXAMPLE = REPO / "examples" / "train_lightning.py"
START_TIMEOUT = 180  # 2 ranks import torch and Lightning on 2 shared cores


def test_lightning_rank_killed_resumes_from_its_ckpt(tmp_path):
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    cfg = tmp_path / "supervise.toml"
    cfg.write_text(f'[run]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_grace_s = 20\n')
    out = supervise(
        "submit", "--nodes=2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--config", str(cfg),
        "--", sys.executable, str(EXAMPLE), "--steps", "30", "--ckpt-dir", str(ckpt), "--ckpt-every", "5",
        "--step-time", "0.3",
    )  # fmt: skip
    camp = Campaign(out.stdout.split()[1], root, ckpt)
    try:
        row = wait_for("rank 1 past step 12", lambda: live_rank(camp.root, 1, 12), START_TIMEOUT)
        env = dict(kv.split("=", 1) for kv in open(f"/proc/{row['pid']}/environ").read().split("\0") if "=" in kv)
        assert env["RANK"] == "1" and env["MASTER_PORT"] == launches(camp)[0]["master"].rsplit(":", 1)[1]
        os.kill(int(row["pid"]), signal.SIGKILL)
        second = wait_for("a relaunch", lambda: launches(camp)[1:] or None, 90)[0]
        resumed = second["resume_step"]
        assert resumed and resumed >= 10 and second["resume_from"].endswith(f"step-{resumed:08d}.ckpt")
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed"
        log2 = next(p for p in camp.root.glob("logs/**/train-2.log"))
        text = log2.read_text(errors="replace")
        steps = [int(line.split()[0].split("=")[1]) for line in step_lines(text)]
        assert steps[0] == resumed + 1 and steps[-1] == 30, steps  # continues from the checkpoint's step
        assert "hpc_ckpt" not in " ".join(p.name for p in ckpt.iterdir())  # Lightning's own requeue never ran
    finally:
        cancel(camp.job_id)

"""Roll back instead of stopping on NaN (issue 27), on the real local Slurm with README's usage and no config:
the example's batch of step 25 is poisoned (its loss NaN, the weights NaN after it). The supervisor stops the
launch without saving the diverged state, relaunches it from the newest snapshot or checkpoint before the
divergence, and tells the ranks to skip the batches seen since (``client.skip_steps()``); the example skips
them, the loss stays finite, and the campaign completes. Checkpoints saved after the last finite loss are
quarantined, as before."""

from __future__ import annotations

import math
import re

import pytest
from campaign_tools import cancel, launches, step_lines, submit, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_a_nan_is_rolled_back_with_its_batches_skipped_and_the_campaign_completes(tmp_path):
    camp = submit(tmp_path, steps=40, ckpt_every=10, step_time=0.2, train=("--nan-at-step", "25"))
    try:
        nan = wait_for("the NaN", lambda: camp.of_type("interruption"), 150)[0]
        assert nan["class"] == "numerical" and nan["blamed_nodes"] == [], nan
        rolled = wait_for("the roll back", lambda: launches(camp)[1:], 60)[0]
        assert rolled["resume_step"] is not None and rolled["resume_step"] < 25, rolled
        first, last = rolled["skip_steps"]
        assert first == rolled["resume_step"] + 1 and last >= 25, rolled
        ended = wait_for("the campaign to complete", camp.ended, 180)
        assert ended["state"] == "completed", ended
        log = sorted(camp.root.glob("logs/*/train-*.log"))[-1].read_text(errors="replace")
        lines = step_lines(log)
        assert [int(n) for n in re.findall(r"skipped the batch of step (\d+)", log)] == list(range(first, last + 1))
        assert [int(line.split()[0][5:]) for line in lines][:1] == [last + 1], "trained again after the skipped ones"
        losses = [float(line.split("loss=")[1]) for line in lines if "loss=" in line]
        assert losses and all(math.isfinite(v) for v in losses), "the poisoned batch was skipped: no NaN again"
        assert [a["params"].get("rollback") for a in camp.of_type("action")
                if a["kind"] == "restart_in_allocation"] == [True]  # fmt: skip
        assert not camp.of_type("checkpoint_requested"), "the diverged state is never saved on request"
        assert camp.report()["excluded_nodes"] == []
    finally:
        cancel(camp.job_id)

"""A program that finished its training and then died in the interpreter's teardown (a library's destructor
aborting at exit: gloo's abort, pytorch#179291; a CUDA context's segfault) on the real local Slurm: the user's
script (``programs/torchsave_train.py``, torch.save, plain gloo DDP) with the client, README's usage. The client
marks the normal end at atexit (``RANK_FLAG_ENDED_CLEAN``), so the SIGABRT after it is no failure: the campaign
completes with its one launch, nobody blamed, instead of being relaunched as an application error."""

from __future__ import annotations

import pytest
from campaign_tools import cancel, launches, wait_for
from matrix_tools import submit_program

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_a_rank_aborting_in_the_teardown_after_its_training_ended_completes_the_campaign(tmp_path):
    camp = submit_program(tmp_path, "--client", "--abort-at-exit-rank", "1", steps=12, ckpt_every=4, step_time=0.1)
    try:
        ended = wait_for("the campaign to end", camp.ended, 180)
        assert ended["state"] == "completed", ended
        assert len(launches(camp)) == 1, "a completed training is not relaunched"
        (last,) = camp.of_type("interruption")
        assert last["class"] == "completed" and not last["blamed_nodes"], last
        assert any("died of SIGABRT after its program had ended normally" in line for line in last["evidence"]), last["evidence"]
    finally:
        cancel(camp.job_id)

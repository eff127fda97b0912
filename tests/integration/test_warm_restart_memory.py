"""Warm restart from the memory tier on the real local Slurm (issues 23 and 27): README's usage with
``[run] warm_restart = "on"`` and no memory settings, the example program with ``--restartable``, plain DDP and
FSDP2 (sharded state, a CPU device mesh over gloo). A rank SIGKILLed from outside: the survivors leave their failed
collective in their own processes, the dead rank is started again alone, and every rank resumes from the snapshot in
node memory (the dead rank's own snapshot outlived it on its node's agent), losing at most two steps instead of the
checkpoint interval. Rank 0's printed losses are bitwise those of an uninterrupted run across both generations.

DDP runs on 2 ranks, FSDP2 on 3. WHY: a new DistributedDataParallel wrapper (any restart, warm or cold) all-reduces
its first step's gradients in its initial bucket layout, which DDP rebuilds after the first step of the
uninterrupted run; with 3 ranks gloo's sum then adds the ranks' values in another order and the weights differ in
the last bit (reproduced without the supervisor: a DDP wrapper rebuilt at step 27 over the same state, 3 ranks,
every parameter off by 1e-8 after 60 steps; bucket_cap_mb or static_graph do not change it; docs/launch.md). Two
values sum the same in either order."""

from __future__ import annotations

import os
import signal

import pytest
from campaign_tools import cancel, launches, live_rank, step_lines, submit, wait_for
from matrix_tools import printed_step, rank_pid_on, wait_printed
from test_memory_tier import reference_of

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]
STEPS = 60
WORLDS = {"ddp": 2, "fsdp2": 3}  # (see the module text)


@pytest.mark.parametrize("style", ["ddp", "fsdp2"])
def test_a_killed_rank_restarts_warm_from_node_memory_bitwise(tmp_path, style: str) -> None:  # type: ignore[no-untyped-def]
    flags = ("--restartable", "--fsdp2") if style == "fsdp2" else ("--restartable",)
    world = WORLDS[style]
    camp = submit(tmp_path, steps=STEPS, ckpt_every=20, step_time=0.3, nodes=world, train=flags,
                  config='warm_restart = "on"\n')  # fmt: skip
    try:
        want = reference_of(tmp_path, STEPS, world, flags)
        survivors = {r: rank_pid_on(camp, r) for r in range(world) if r != 1}
        wait_printed(camp, 1, 27)
        os.kill(rank_pid_on(camp, 1), signal.SIGKILL)
        killed_at = printed_step(camp, 1)
        picked = wait_for("the memory pick", lambda: camp.of_type("memory_pick"), 90)[0]
        assert picked["step"] is not None and killed_at - 2 <= picked["step"] <= killed_at, (picked, killed_at)
        assert picked["fetches"] == 0, picked  # rank 1 starts again on its own node, where its snapshot is
        # generation 1 trains in the survivors' own processes (the live table's pid of each, past the resume)
        for rank, pid in survivors.items():
            row = wait_for(f"rank {rank} past the resume", lambda r=rank: live_rank(camp.root, r, min(killed_at + 4, STEPS)),
                           60, poll=0.2)  # fmt: skip
            assert int(row["pid"]) == pid, (rank, row, pid)
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
        first, again = launches(camp)
        assert again["warm"] is True and again["generation"] == 1 and again["replaced_ranks"] == [1], again
        assert again["resume_tier"] == "memory" and again["resume_step"] == picked["step"], again
        assert not camp.of_type("warm_restart_skipped")
        kinds = [a["kind"] for a in camp.of_type("action")]
        assert "kill_step" not in kinds, kinds  # the survivors' step was never killed
        recovery = camp.report()["attempts"][1]["recovery"]  # the supervisor's clock on each phase of it
        assert recovery["how"] == "warm" and recovery["class"] == "unknown", recovery  # (a SIGKILL: no one to blame)
        assert all(recovery[k] is not None for k in ("teardown_s", "release_s", "order_s", "up_s", "total_s")), recovery
        assert recovery["release_s"] + recovery["order_s"] <= recovery["teardown_s"] <= recovery["total_s"], recovery
        # the state load, timed by the ranks around the example's phase("restore"): a part of the start-up
        assert recovery["restore_s"] is not None and 0 <= recovery["restore_s"] <= recovery["total_s"], recovery
        log = next(camp.root.glob("logs/*/train-1.log")).read_text(errors="replace")
        lines = step_lines(log)  # rank 0, one process: generation 0, then generation 1 from the snapshot
        resumed = STEPS - picked["step"]
        assert lines == want[: len(lines) - resumed] + want[picked["step"]:], "not the uninterrupted losses"
        assert len(lines) - resumed >= killed_at, "generation 0 printed up to the kill"
        assert f"resumed from memory at step {picked['step']}" in log, log[-2000:]
    finally:
        cancel(camp.job_id)

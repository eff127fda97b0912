"""Issue 26, stragglers beyond DDP: a user-style FSDP2 program (programs/fsdp2_dcp_train.py: ``fully_shard``, plain
DCP, ``client.watch_collectives()``) on 3 nodes + 1 spare; from step 25 the rank on one node runs its forward pass
0.4 s slower. FSDP2's collectives make every rank step at its pace; each rank's own time (its waits in FSDP2's
all-gathers and reduce-scatters left out) names it; keeping it would cost more of the next hour than a relaunch,
and a spare is free, so it is swapped: an L3 alert, every rank checkpoints and stops, the relaunch runs without
its node (the spare takes its place) from that checkpoint, at full speed, and the campaign completes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from campaign_tools import Campaign, cancel, launches, supervise, wait_for
from matrix_tools import Row, record_time, wait_printed

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

PROGRAM = Path(__file__).resolve().parent / "programs" / "fsdp2_dcp_train.py"
CONFIG = """[preflight]
enabled = false
[run]
spare_nodes = 1
summary_interval_s = 0.25
[detect]
straggler_consecutive = 2
straggler_interval_s = 2
"""


def test_a_straggler_under_fsdp2_is_named_by_its_own_time_and_swapped_for_the_spare(tmp_path: Path) -> None:
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    (tmp_path / "c.toml").write_text(CONFIG)
    out = supervise("submit", "--nodes=3", "--ntasks-per-node=1", "--time=10", "--campaign", str(root),
                    "--config", str(tmp_path / "c.toml"), "--", sys.executable, str(PROGRAM), "--steps", "160",
                    "--ckpt-dir", str(ckpt), "--ckpt-every", "1000", "--step-time", "0.2", "--slow-rank", "2",
                    "--slow-s", "0.4", "--slow-from-step", "25")  # fmt: skip
    camp = Campaign(out.stdout.split()[1], root, ckpt)
    try:
        first = wait_for("the first launch", lambda: launches(camp) or None, 150)[0]
        slow_node = first["nodes"][2]  # rank 2's node (one task per node, ranks in node order)
        ckpt.mkdir(parents=True, exist_ok=True)
        (ckpt / "slow-node").write_text(slow_node)
        wait_printed(camp, 1, 24)
        assert not [e for e in camp.of_type("detection") if e["kind"] == "straggler"]  # the control: nobody slow
        found = wait_for("a straggler detection", lambda: [e for e in camp.of_type("detection")
                                                           if e["kind"] == "straggler"], 60)[0]  # fmt: skip
        assert found["nodes"] == [slow_node] and found["metric"] == "own_ewma_s", found
        assert "swapped for a spare" in found["evidence"][-1], found["evidence"]
        row = Row(camp, 0)
        got = row.check("straggler", [slow_node], "restart_in_allocation")
        assert "swapped for a spare" in got["evidence"][0] and got["origin_ranks"] == [2], got
        assert len([e for e in camp.of_type("detection") if e["kind"] == "straggler"]) == 1  # journaled once
        assert {"alert", "stop_step"} <= set(row.actions()), row.actions()
        alert = [e for e in camp.of_type("action") if e["kind"] == "alert" and e["t"] >= found["t"]]
        assert alert and alert[0]["tier"] == "L3" and alert[0]["target"] == [slow_node], alert
        relaunch = row.relaunch()
        assert slow_node not in relaunch["nodes"] and len(relaunch["nodes"]) == 3, relaunch
        saved = wait_for("the checkpoint taken before the swap", lambda: sorted(ckpt.glob("step_*")) or None, 5)
        assert relaunch["resume_step"] is not None and relaunch["resume_step"] >= 25, relaunch
        assert Path(relaunch["resume_from"]).name in {p.name for p in saved}
        record_time("straggler swapped for a spare (FSDP2)", swapped_s=relaunch["t"] - found["t"])
        ended = wait_for("the campaign to complete", camp.ended, 150)
        assert ended["state"] == "completed", ended
        kinds = [e["class"] for e in camp.of_type("interruption")]
        assert kinds == ["straggler", "completed"], kinds  # the relaunch runs at full speed: no second swap
    finally:
        cancel(camp.job_id)

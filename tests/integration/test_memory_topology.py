"""The memory tier's buddy ring across switches on a real Slurm topology (issue 27): a local cluster with two leaf
switches under one spine (``python -m slurm.localcluster up --topology``: node1,node4 on leaf0, node2,node3 on
leaf1; ``make test-topology`` starts it and runs this file). Skipped on a cluster without a topology.

A ring by node name would make node3 node2's buddy: one switch lost takes both, and the copy with them. The
supervisor reads ``scontrol show topology`` and puts every node's buddy on the other switch, so losing a whole
switch (the non-batch training node and its switch-mate, a spare) leaves every shard in memory on the other one,
and the relaunch goes to the other switch's nodes at once.
"""

from __future__ import annotations

import pytest
from campaign_tools import cancel, launches, step_lines, submit, wait_for
from matrix_tools import printed_step, wait_printed
from test_memory_tier import STEPS, job_batch_host, reference

from slurm.cli_backend import CliSlurmClient

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_a_lost_switch_leaves_every_shard_on_the_other_one_and_the_relaunch_resumes_from_memory_bitwise(
        tmp_path, crashable_cluster):  # fmt: skip
    if not crashable_cluster.spec.topology:
        pytest.skip("needs the two-switch local cluster: make test-topology")
    switch = CliSlurmClient().switches()
    assert set(switch) == set(crashable_cluster.node_names) and len(set(switch.values())) == 2, switch
    camp = submit(tmp_path, steps=STEPS, ckpt_every=20, step_time=0.3,
                  config='spare_nodes = 2\nmemory_persist = "off"\n')  # fmt: skip
    try:
        want = reference(tmp_path)
        wait_printed(camp, 1, 25)
        ring = wait_for("the buddy ring over four nodes", lambda: (r := camp.of_type("memory_buddies")[-1:])
                        and len(r[0]["ring"]) == 4 and r[0]["ring"], 30)  # fmt: skip
        assert all(switch[node] != switch[buddy] for node, buddy in ring.items()), (ring, switch)
        batch = wait_for("the batch host", lambda: job_batch_host(camp.job_id), 30)
        victim = next(n for n in launches(camp)[0]["nodes"] if n != batch)
        mate = next(n for n in switch if switch[n] == switch[victim] and n != victim)
        assert batch not in (victim, mate), (batch, victim, mate, switch)
        crashable_cluster.crash_nodes([victim, mate])  # the switch is lost: both nodes, both memories
        killed_at = printed_step(camp, 1)
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
        final = launches(camp)[-1]
        assert not {victim, mate} & set(final["nodes"]), final
        # One relaunch: even when the switch-mate's loss is not judged yet, its silence keeps it out
        # (placement.without_doubtful), and the relaunch does not wait for a fetch to a node that is gone.
        assert len(launches(camp)) == 2, launches(camp)
        assert final["resume_tier"] == "memory" and killed_at - 2 <= final["resume_step"] <= killed_at, (final,
                                                                                                         killed_at)
        assert final["resume_step"] > 20, "newer than the filesystem checkpoint"
        log = next(camp.root.glob(f"logs/*/train-{final['launch']}.log")).read_text(errors="replace")
        assert step_lines(log) == want[final["resume_step"]:], "resumed from the other switch's copy, bitwise"
    finally:
        cancel(camp.job_id)

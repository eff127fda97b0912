"""Never pending for ever (issue 26): when the nodes a requeue must exclude leave the job's partition too few
nodes, Slurm would keep the job PENDING for good while the campaign looked merely requeued. The supervisor holds
the job instead, says in one line which nodes are out and why and how to let one back in; forgiving the node
takes it out of the job's ExcNodeList, and the released job resumes. User-style program:
programs/torchsave_train.py (torch.save checkpoints, plain srun ranks)."""

from __future__ import annotations

import subprocess

import pytest
from campaign_tools import cancel, job_state, supervise, wait_for
from matrix_tools import Row, record_time, submit_program
from test_fault_matrix_crashes import mark_bad_node

from slurm.hostlist import expand

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def show_job(job_id: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    return dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)


def test_a_requeue_that_could_never_start_is_held_with_one_line_then_forgiven_and_released(tmp_path):
    # 4 nodes in the partition, two excluded by the user: the 2-node job has exactly two to run on.
    camp = submit_program(tmp_path, "--xid-on-bad-node", "5", steps=14, ckpt_every=2, nodes=2,
                          sbatch=("--time=10", "--exclude=node3,node4"))  # fmt: skip
    try:
        bad = mark_bad_node(camp, 1)
        row = Row(camp, 0)
        got = row.check("hardware", [bad], "hold")
        held = wait_for("the campaign held", lambda: (e := camp.ended()) and e["state"] == "held" and e, 60)
        line = held["reason"]
        assert "\n" not in line and "needs 2 nodes and partition batch has 4" in line, line
        for node in (bad, "node3", "node4"):
            assert node in line, line
        assert "--forgive NODE" in line and f"scontrol release {camp.job_id}" in line, line
        record_time("requeue that could never start", held_s=held["t"] - got["t"])
        state = wait_for("the job held in the queue", lambda: (s := job_state(camp.job_id)) and s[0] == "PENDING"
                         and s, 60)  # fmt: skip
        shown = show_job(camp.job_id)
        assert shown.get("Priority") == "0" or shown.get("Reason") == "job_requeued_in_held_state", shown
        assert set(expand(shown["ExcNodeList"])) == {bad, "node3", "node4"}, shown
        # The operator repairs the node (here: the program no longer fails there) and lets it back in.
        (camp.ckpt / "bad-node").unlink()
        out = supervise("nodes", str(camp.root), "--forgive", bad).stdout
        assert f"{bad} taken out of job {camp.job_id}'s ExcNodeList" in out, out
        assert "scontrol release" in out, out
        assert set(expand(show_job(camp.job_id)["ExcNodeList"])) == {"node3", "node4"}  # the user's own stay
        subprocess.run(["scontrol", "release", camp.job_id], check=True, timeout=30)
        ended = wait_for("the campaign to complete after the release",
                         lambda: (e := camp.ended()) and e["state"] == "completed" and e, 300)  # fmt: skip
        assert ended["state"] == "completed", state
        resumed = camp.of_type("step_launched")[-1]
        assert resumed["resume_step"] is not None and resumed["resume_step"] >= 4, resumed
    finally:
        cancel(camp.job_id)

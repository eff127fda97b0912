"""Health in the node agents on the real local Slurm: node2's agent reads a recorded GPU fault (uncorrectable ECC
errors and Xid 79 through the NVML-shaped seam, SUPERVISOR_HEALTH_RECORDED); the supervisor journals it, blames
node2 as hardware, and the next launch runs on the spare node instead. The training never runs on node2 again."""

from __future__ import annotations

import json
import os

import pytest
from campaign_tools import cancel, launches, submit, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 150  # job scheduled, agents up, ranks import torch (2 shared cores)
HEALTHY = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0c2a", "ecc_uncorrected_volatile": 0,
           "remapped_rows": [0, 0, 0, 0], "retired_pages_pending": 0, "temperature_c": 40, "throttle_reasons": 0}
FAULTY = {**HEALTHY, "uuid": "GPU-9be1", "ecc_uncorrected_volatile": 4}


def test_a_gpu_fault_found_by_the_agent_blames_its_node_and_the_next_launch_excludes_it(tmp_path, monkeypatch):
    recorded = tmp_path / "nvml.json"
    recorded.write_text(json.dumps({"node2": {"gpus": [FAULTY], "xids": [{"gpu": 0, "code": 79}]},
                                    "*": {"gpus": [HEALTHY]}}))  # fmt: skip
    monkeypatch.setenv("SUPERVISOR_HEALTH_RECORDED", str(recorded))  # sbatch passes the environment on
    camp = submit(tmp_path, steps=12, step_time=0.2, nodes=3, sbatch=("--time=10", "--nodelist=node[1-3]"),
                  config="spare_nodes = 1\nhealth_interval_s = 5\n")  # fmt: skip
    try:
        ended = wait_for("the campaign to end", camp.ended, START_TIMEOUT + 120)
        assert ended["state"] == "completed", ended
        health = [e for e in camp.of_type("health") if e["node"] == "node2"]
        assert health and health[0]["unfit"], camp.of_type("health")
        checks = {f["check"]: f["value"] for f in health[0]["findings"]}
        assert checks.get("gpu0_ecc_uncorrectable") == "4" and checks.get("xid") == "79", checks
        assert not [e for e in camp.of_type("health") if e["node"] != "node2"]  # healthy nodes: nothing to say
        first = camp.of_type("interruption")[0]
        assert first["class"] == "hardware" and first["blamed_nodes"] == ["node2"], first
        steps = launches(camp)
        assert steps[0]["nodes"] == ["node1", "node2"]
        assert all("node2" not in s["nodes"] for s in steps[1:]) and steps[1]["excluded"] == ["node2"]
        assert steps[-1]["nodes"] == ["node1", "node3"]
        assert os.environ["SUPERVISOR_HEALTH_RECORDED"] == str(recorded)
    finally:
        cancel(camp.job_id)

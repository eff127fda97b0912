"""Health in the node agents on the real local Slurm: node2's agent reads a recorded GPU fault (Xid 79 through the
NVML event API of the tests' pynvml, tests/harness/nvml_shadow, with SUPERVISOR_HEALTH_RECORDED) while the training runs; the supervisor
journals it, ends the launch as hardware blaming node2, and the next launch runs on the spare node instead."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from campaign_tools import cancel, launches, submit, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 150  # job scheduled, agents up, ranks import torch (2 shared cores)
HEALTHY = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-0c2a", "ecc_uncorrected_volatile": 0,
           "remapped_rows": [0, 0, 0, 0], "retired_pages_pending": 0, "temperature_c": 40, "throttle_reasons": 0}
SECOND = {**HEALTHY, "uuid": "GPU-9be1"}


def test_a_gpu_fault_found_by_the_agent_blames_its_node_and_the_next_launch_excludes_it(tmp_path, monkeypatch):
    recorded = tmp_path / "nvml.json"
    # node2's GPU is healthy at the first check, then reports Xid 79 (through the NVML event API) a few seconds
    # into the run: the running launch must end, blaming node2, and the relaunch run on the spare.
    recorded.write_text(json.dumps({"node2": {"gpus": [SECOND], "xids": [{"gpu": 0, "code": 79, "after_s": 6}]},
                                    "*": {"gpus": [HEALTHY]}}))  # fmt: skip
    monkeypatch.setenv("SUPERVISOR_HEALTH_RECORDED", str(recorded))  # sbatch passes the environment on
    shadow = Path(__file__).parents[1] / "harness" / "nvml_shadow"  # the tests' pynvml, first on the agents' path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")])))
    # two training nodes and a spare: submit asks for 3 nodes ([run] spare_nodes)
    camp = submit(tmp_path, steps=40, step_time=0.2, nodes=2, sbatch=("--time=10", "--nodelist=node[1-3]"),
                  config="spare_nodes = 1\nhealth_interval_s = 2\n")  # fmt: skip
    try:
        ended = wait_for("the campaign to end", camp.ended, START_TIMEOUT + 120)
        assert ended["state"] == "completed", ended
        health = [e for e in camp.of_type("health") if e["node"] == "node2"]
        assert health and health[0]["unfit"], camp.of_type("health")
        checks = {f["check"]: f["value"] for f in health[0]["findings"]}
        assert checks == {"xid": "79"}, checks
        assert not [e for e in camp.of_type("health") if e["node"] != "node2"]  # healthy nodes: nothing to say
        steps = launches(camp)
        assert all("node2" not in s["nodes"] for s in steps if s["t"] > health[0]["t"]), steps
        assert steps[-1]["nodes"] == ["node1", "node3"] and steps[-1]["excluded"] == ["node2"]
        if steps[0]["nodes"] == ["node1", "node2"]:  # the usual path: the fault came during the first launch
            first = camp.of_type("interruption")[0]
            assert first["class"] == "hardware" and first["blamed_nodes"] == ["node2"], first
            assert any("xid 79" in line for line in first["evidence"]), first
        assert camp.report()["excluded_nodes"] == ["node2"]
        assert os.environ["SUPERVISOR_HEALTH_RECORDED"] == str(recorded)
    finally:
        cancel(camp.job_id)

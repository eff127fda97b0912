"""The preflight before a launch on the real local Slurm: three nodes (one spare), node2's measurement process
throttled for real (SIGSTOP/SIGCONT, stopped 80 ms of every ~85 ms); the supervisor's preflight flags node2 as
markedly slower than its peers, journals it, and the training runs on node1 and node3 only, to completion."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from campaign_tools import cancel, launches, submit, wait_for
from test_preflight_slurm import _throttle

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 150  # job scheduled, agents up, preflight (torch import on 3 nodes), ranks import torch


def test_a_node_slow_in_preflight_never_receives_the_training(tmp_path: Path) -> None:
    stop = threading.Event()
    root = tmp_path / "campaign"
    thread = threading.Thread(target=_throttle, args=(root / "preflight", "node2", stop), daemon=True)
    thread.start()
    # two training nodes and a spare: submit asks for 3 nodes ([run] spare_nodes)
    camp = submit(tmp_path, steps=12, step_time=0.2, nodes=2, sbatch=("--time=10", "--nodelist=node[1-3]"),
                  config="spare_nodes = 1\n", preflight='enabled = "auto"\nbudget_s = 90')  # fmt: skip
    try:
        ended = wait_for("the campaign to end", camp.ended, START_TIMEOUT + 120)
        assert ended["state"] == "completed", ended
        (check,) = camp.of_type("preflight")
        assert check["blamed_nodes"] == ["node2"] and check["enough"], check
        assert "compute" in check["slow"]["node2"] and not check["errors"], check
        assert set(check["figures"]) == {"node1", "node2", "node3"}
        steps = launches(camp)
        assert steps[0]["nodes"] == ["node1", "node3"] and steps[0]["excluded"] == ["node2"]
        assert all("node2" not in s["nodes"] for s in steps)
        assert [i["class"] for i in camp.of_type("interruption")] == ["completed"]
        assert camp.report()["excluded_nodes"] == ["node2"]
    finally:
        stop.set()
        thread.join(30)
        cancel(camp.job_id)

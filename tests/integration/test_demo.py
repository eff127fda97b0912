"""The README's main job, end to end: `examples/demo.py` on the real local Slurm recovers from a rank hang and a
node crash and ends with a completed campaign whose report names both faults."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from campaign_tools import REPO

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_demo_recovers_from_a_hang_and_a_node_crash(tmp_path, crashable_cluster):
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "demo.py"), "--workdir", str(tmp_path),
                           "--steps", "120"], capture_output=True, text=True, timeout=900, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    outcomes = [a["outcome"]["class"] for a in report["attempts"]]
    assert outcomes[0] == "hang" and outcomes[-1] == "completed"
    crash = report["attempts"][outcomes.index("node_failure")]
    blamed = crash["outcome"]["blamed_nodes"]
    assert len(blamed) == 1
    # The run after the crash did not use the crashed node, and resumed from a checkpoint.
    after = report["attempts"][outcomes.index("node_failure") + 1]
    assert blamed[0] not in after["nodes"] and after["resume_step"]
    assert after["restart"] == crash["restart"] + 1  # a new Slurm run (requeue), same job
    # The exact ledger: every millisecond in one bucket, per launch too; both faults charged to their class.
    g = report["goodput"]
    assert g["productive_s"] > 0 and round(g["productive_s"] + sum(g["badput_s"].values()), 3) == g["wall_s"]
    rows = [a["goodput"] for a in report["attempts"]]
    assert round(sum(r["productive_s"] + sum(r["badput_s"].values()) for r in rows)
                 + sum(g["before_first_launch_s"].values()), 3) == g["wall_s"]  # fmt: skip
    assert {"hang", "node_failure"} <= set(g["by_class"])
    assert g["by_class"]["hang"]["interruptions"] == 1 and g["by_class"]["node_failure"]["interruptions"] == 1
    assert g["by_class"]["hang"]["badput_s"].get("detection", 0) > 0  # the silent rank, before it was called
    assert g["badput_s"]["checkpoint"] > 0 and g["ideal_step_s"]  # stalls measured by the client; step times
    assert g["badput_s"]["restart"] > 0 and g["badput_s"]["queue"] > 0  # start-ups; the requeue after the crash
    assert "FAULT 1" in proc.stdout and "FAULT 2" in proc.stdout

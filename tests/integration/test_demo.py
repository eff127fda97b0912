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
    assert report["goodput"]["productive_s"] > 0 and report["goodput"]["badput_s"]["lost_work"] >= 0
    assert "FAULT 1" in proc.stdout and "FAULT 2" in proc.stdout

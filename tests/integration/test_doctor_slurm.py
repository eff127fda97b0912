"""`supervise doctor` against the real local cluster: it reads slurmctld's running configuration and judges
the settings the local cluster's slurm.conf sets (KillWait=5 is a warning, preemption is set up right)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slurm


def _doctor(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "doctor", *flags], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ), check=False)  # fmt: skip


def test_doctor_reads_the_running_configuration(slurm_cluster) -> None:
    proc = _doctor("--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    found = {c["setting"]: c for c in doc["checks"]}
    conf = slurm_cluster.conf.read_text()
    assert "KillWait=5" in conf and found["KillWait"]["value"] == "5 s" and found["KillWait"]["status"] == "warn"
    assert found["PreemptMode"]["status"] == "ok" and found["SlurmctldParameters"]["status"] == "ok"
    assert found["GraceTime (partition batch)"]["value"] == "10"
    assert doc["status"] == "warn"
    strict = _doctor("--strict")
    assert strict.returncode == 3
    assert "WARN  KillWait = 5 s" in strict.stdout and "fix: set KillWait=30" in strict.stdout


def test_doctor_says_slurm_is_unreachable(tmp_path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=nowhere\nSlurmctldHost=nohost(127.0.0.1)\nSlurmctldPort=9\n")
    proc = subprocess.run([sys.executable, "-m", "supervisor.cli", "doctor"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "SLURM_CONF": str(conf)}, check=False)  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "FAIL  supervise: error:" in proc.stdout

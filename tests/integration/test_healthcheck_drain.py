"""`supervise healthcheck --drain` on the local cluster: a check made to fail (a free-space threshold above the
free space) drains the node with a reason naming the check, value and threshold; a second run with the check
passing resumes it; a node someone else drained is never resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from slurm.cli_backend import CliSlurmClient

pytestmark = pytest.mark.slurm
NODE = "node4"


def _healthcheck(*flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "healthcheck", "--drain", "--node", NODE, "--json",
                           *flags], capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False)  # fmt: skip


def _node(client: CliSlurmClient):
    info = client.node(NODE)
    assert info is not None
    return info


@pytest.fixture
def client(slurm_cluster):
    c = CliSlurmClient()
    yield c
    if _node(c).is_drain:
        c.resume([NODE])


def test_failing_check_drains_and_passing_check_resumes(client, tmp_path) -> None:
    free_gib = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize / (1 << 30)
    started = time.monotonic()
    bad = _healthcheck("--fs", f"checkpoint={tmp_path}", "--limit", f"fs_min_free_gib={free_gib * 10 + 1:.0f}")
    took = time.monotonic() - started
    assert bad.returncode == 8, bad.stdout + bad.stderr
    doc = json.loads(bad.stdout)
    assert doc["drain"]["action"] == "drain"
    info = _node(client)
    assert info.is_drain
    assert info.reason.startswith(f"supervise: fs_free:{tmp_path} ") and "(threshold " in info.reason
    assert took < 60, "a HealthCheckProgram must finish within Slurm's 60 s"

    again = json.loads(_healthcheck("--fs", f"checkpoint={tmp_path}", "--limit",
                                    f"fs_min_free_gib={free_gib * 10 + 1:.0f}").stdout)  # fmt: skip
    assert again["drain"]["action"] == "none"  # same reason: left as it is

    good = _healthcheck("--fs", f"checkpoint={tmp_path}")
    assert good.returncode == 0, good.stdout + good.stderr
    assert json.loads(good.stdout)["drain"]["action"] == "resume"
    assert not _node(client).is_drain


def test_a_node_drained_by_someone_else_is_left_alone(client, tmp_path) -> None:
    client.drain([NODE], "admin: fan replacement")
    good = _healthcheck("--fs", f"checkpoint={tmp_path}")
    assert good.returncode == 0
    assert json.loads(good.stdout)["drain"]["action"] == "none"
    info = _node(client)
    assert info.is_drain and info.reason == "admin: fan replacement"

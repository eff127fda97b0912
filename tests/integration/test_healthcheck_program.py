"""`supervise healthcheck --drain` as the local cluster's real HealthCheckProgram (slurmd runs it every 5 s,
SLURMD_NODENAME set), and `supervise doctor` seeing that one setting changed in the running configuration.

The test appends HealthCheckProgram/HealthCheckInterval to the cluster's slurm.conf and reconfigures; the
original file is restored (and reconfigured) whatever happens, and the drained node resumed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm.cli_backend import CliSlurmClient

pytestmark = pytest.mark.slurm
NODE = "node4"
ROOT = Path(__file__).resolve().parents[2]


def _reconfigure() -> None:
    subprocess.run(["scontrol", "reconfigure"], check=True, timeout=60, capture_output=True)


def _wait(what: str, probe, timeout: float = 90.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def health_program(slurm_cluster, tmp_path: Path) -> Iterator[Path]:
    """The cluster runs a wrapper of `supervise healthcheck --drain` every 5 s; ``flag`` set = node4's
    free-space threshold is raised above the free space."""
    flag = tmp_path / "fail-node4"
    wrapper = tmp_path / "health.sh"
    wrapper.write_text(
        "#!/bin/sh\n"
        f"limit=1; [ \"$SLURMD_NODENAME\" = {NODE} ] && [ -e {flag} ] && limit=100000000\n"
        f"site=$(cat {tmp_path}/site-args 2>/dev/null)\n"
        f"exec env PYTHONPATH={ROOT} SLURM_CONF={slurm_cluster.conf} {sys.executable} -m supervisor.cli healthcheck "
        f"--drain --node \"$SLURMD_NODENAME\" --fs checkpoint={tmp_path} --limit fs_min_free_gib=$limit $site "
        f">> {tmp_path}/health-$SLURMD_NODENAME.log 2>&1\n"
    )
    wrapper.chmod(0o755)
    conf = Path(slurm_cluster.conf)
    original = conf.read_text()
    try:
        conf.write_text(original + f"HealthCheckProgram={wrapper}\nHealthCheckInterval=5\nHealthCheckNodeState=ANY\n")
        _reconfigure()
        yield flag
    finally:
        conf.write_text(original)
        _reconfigure()
        client = CliSlurmClient()
        info = client.node(NODE)
        if info is not None and info.is_drain:
            client.resume([NODE])


def test_health_check_program_drains_and_resumes_and_doctor_sees_it(health_program: Path) -> None:
    doctor = subprocess.run([sys.executable, "-m", "supervisor.cli", "doctor", "--json"], capture_output=True,
                            text=True, timeout=120, env=dict(os.environ), check=False)  # fmt: skip
    found = {c["setting"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert found["HealthCheckProgram"]["status"] == "ok" and "every 5 s" in found["HealthCheckProgram"]["value"]

    client = CliSlurmClient()
    health_program.touch()
    info = _wait(f"{NODE} drained by its HealthCheckProgram",
                 lambda: (lambda i: i if i is not None and i.is_drain else None)(client.node(NODE)))  # fmt: skip
    assert info.reason.startswith(f"supervise: fs_free:{health_program.parent} ")
    others = [n for n in client.nodes(["node1", "node2", "node3"]) if n.is_drain]
    assert others == [], "only the node whose check fails is drained"

    health_program.unlink()
    _wait(f"{NODE} resumed once its check passes", lambda: not client.node(NODE).is_drain)  # type: ignore[union-attr]


def test_the_health_check_tells_the_site_once_per_drain_and_it_keeps_everyone_off(health_program: Path) -> None:
    """With --site-url the drain is also a verdict read from the node (docs/site.md): another user's campaigns
    leave the node out at once, and a node that stays unfit over many health intervals is one failure, not many."""
    from site_tools import start_site

    from supervisor.site.client import SiteClient, read_token_file

    work = health_program.parent
    url, server, _ = start_site(work / "site", ROOT)
    try:
        for user in ("health", "bob"):
            subprocess.run([sys.executable, "-m", "supervisor.cli", "site", "token", "--dir", str(work / "site"),
                            "--user", user, "--out", str(work / f"{user}.token")], check=True, cwd=ROOT,
                           capture_output=True)  # fmt: skip
        (work / "site-args").write_text(f"--site-url {url} --site-token-file {work / 'health.token'}")
        client = CliSlurmClient()
        health_program.touch()
        _wait(f"{NODE} drained", lambda: (lambda i: i is not None and i.is_drain)(client.node(NODE)))
        bob = SiteClient(url, read_token_file(work / "bob.token"))
        held = _wait("the site told", lambda: bob.excluded())
        assert [n for n, _ in held] == [NODE], held
        time.sleep(12)  # two more health intervals with the node still unfit (and drained)
        admin = SiteClient(url, read_token_file(work / "site" / "token"))
        [row] = [n for n in admin.request("GET", "/v1/fleet")["nodes"] if n["node"] == NODE]
        assert row["failures"] == 1 and row["verdicts"][0]["source"] == "node", row
        assert row["verdicts"][0]["class"] == "node_unfit" and row["verdicts"][0]["user"] == "health"
        health_program.unlink()
        _wait(f"{NODE} resumed once its check passes", lambda: not client.node(NODE).is_drain)  # type: ignore[union-attr]
    finally:
        server.kill()

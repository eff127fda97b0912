"""The site's repair loop through the real `scontrol` of the local Slurm (docs/site.md, `supervise site serve
--repair`): a node another user's node agent read an Xid 79 from is drained with the evidence as the reason; the
reboot that follows is refused by this cluster (no RebootProgram) and recorded once, the node staying drained for
a person; an operator's `supervise site forgive` returns it to service; a printed Xid line drains nothing. With a
RebootProgram (the cluster's own simulated reboot, slurm/localcluster/reboot.py), the reboot is taken: the node
comes back freshly booted, Slurm resumes it (nextstate=RESUME) and the loop forgives it."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from campaign_tools import REPO, supervise, wait_for
from site_tools import start_site

from supervisor.site.client import SiteClient, read_token_file

pytestmark = pytest.mark.slurm


def node_line(node: str) -> str:
    return subprocess.run(["scontrol", "show", "node", "-o", node], capture_output=True, text=True,
                          timeout=30).stdout  # fmt: skip


def repairs(site: Path) -> list[tuple[str, str, str | None]]:
    with sqlite3.connect(site / "site.db") as db:
        return [(n, k, e) for n, k, e in db.execute("SELECT node, kind, error FROM repairs ORDER BY id")]


def test_the_repair_loop_drains_records_a_refused_reboot_and_resumes_after_forgiveness(tmp_path: Path,
                                                                                        slurm_cluster) -> None:  # fmt: skip
    site = tmp_path / "site"
    url, server, first = start_site(site, REPO, "--repair", "--repair-every", "1", "--repair-max-share", "0.5")
    try:
        assert "repair loop on" in first
        supervise("site", "token", "--dir", str(site), "--user", "alice", "--out", str(tmp_path / "alice.token"))
        alice = SiteClient(url, read_token_file(tmp_path / "alice.token"))
        alice.post_verdict(node="node4", source="program", klass="hardware", confidence=0.9,
                           evidence=["Xid 79 (printed by the program)"], job="1", campaign="alice-llm")
        alice.post_verdict(node="node3", source="node", klass="hardware", confidence=0.95,
                           evidence=["health check on node3: Xid 79: GPU has fallen off the bus"], job="1",
                           campaign="alice-llm")  # fmt: skip
        wait_for("node3 drained", lambda: "DRAIN" in node_line("node3"), 60)
        assert "Reason=supervise-site: health check on node3: Xid 79" in node_line("node3")
        wait_for("the reboot tried", lambda: any(k == "reboot" for _, k, _ in repairs(site)), 60)
        (reboot,) = [r for r in repairs(site) if r[1] == "reboot"]
        assert reboot[0] == "node3" and reboot[2]  # refused by Slurm here (no RebootProgram), recorded
        assert "DRAIN" in node_line("node3") and "DRAIN" not in node_line("node4")  # printed text drains nothing
        supervise("site", "forgive", "node3", "--url", url, "--token-file", str(site / "token"))
        wait_for("node3 back in service", lambda: "DRAIN" not in node_line("node3"), 60)
        assert [k for n, k, _ in repairs(site) if n == "node3"] == ["drain", "reboot", "resume"]
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        subprocess.run(["scontrol", "update", "NodeName=node3", "State=RESUME"], capture_output=True, timeout=30)


@pytest.fixture
def rebootable(crashable_cluster, tmp_path: Path) -> Iterator[Path]:  # type: ignore[no-untyped-def]
    """The cluster with a RebootProgram (the local cluster's simulated reboot: its slurmd restarted with a fresh
    boot time, its processes and memory lost) and `supervise healthcheck --drain` as HealthCheckProgram every 5 s,
    which finds node3 unfit while the returned flag file exists. slurm.conf is restored (and reconfigured)
    whatever happens."""
    cluster = crashable_cluster
    if cluster.chroot is not None:
        pytest.skip("the simulated reboot needs the host's Slurm (the chroot's slurmd cannot run the repo's python)")
    wrapper = tmp_path / "reboot.sh"
    wrapper.write_text(f"#!/bin/sh\nexec env PYTHONPATH={REPO} {sys.executable} -m slurm.localcluster.reboot "
                       f"--root {cluster.root} --base-port {cluster.spec.base_port}\n")  # fmt: skip
    wrapper.chmod(0o755)
    flag = tmp_path / "node3-unfit"
    health = tmp_path / "health.sh"
    health.write_text(
        "#!/bin/sh\n"
        f"limit=1; [ \"$SLURMD_NODENAME\" = node3 ] && [ -e {flag} ] && limit=100000000\n"
        f"exec env PYTHONPATH={REPO} SLURM_CONF={cluster.conf} {sys.executable} -m supervisor.cli healthcheck "
        f"--drain --node \"$SLURMD_NODENAME\" --fs checkpoint={tmp_path} --limit fs_min_free_gib=$limit "
        f">> {tmp_path}/health-$SLURMD_NODENAME.log 2>&1\n")  # fmt: skip
    health.chmod(0o755)
    conf = Path(cluster.conf)
    original = conf.read_text()
    try:
        conf.write_text(original + f"RebootProgram={wrapper}\nHealthCheckProgram={health}\nHealthCheckInterval=5\n"
                        "HealthCheckNodeState=ANY\n")  # fmt: skip
        subprocess.run(["scontrol", "reconfigure"], check=True, timeout=60, capture_output=True)
        yield flag
    finally:
        flag.unlink(missing_ok=True)  # a health check still running finds node3 fit: it drains nothing after us
        conf.write_text(original)
        subprocess.run(["scontrol", "reconfigure"], check=True, timeout=60, capture_output=True)
        time.sleep(1)
        subprocess.run(["scontrol", "update", "NodeName=node3", "State=RESUME"], capture_output=True, timeout=30)


def boot_time(node: str) -> str:
    line = node_line(node)
    return line.split("BootTime=", 1)[1].split()[0]


def test_a_reboot_slurm_takes_returns_the_node_and_the_loop_forgives_it(tmp_path: Path, rebootable) -> None:  # type: ignore[no-untyped-def]
    site = tmp_path / "site"
    booted = boot_time("node3")
    url, server, first = start_site(site, REPO, "--repair", "--repair-every", "1", "--repair-max-share", "0.5")
    try:
        assert "repair loop on" in first
        supervise("site", "token", "--dir", str(site), "--user", "alice", "--out", str(tmp_path / "alice.token"))
        supervise("site", "token", "--dir", str(site), "--user", "bob", "--out", str(tmp_path / "bob.token"))
        alice = SiteClient(url, read_token_file(tmp_path / "alice.token"))
        alice.post_verdict(node="node3", source="node", klass="hardware", confidence=0.95,
                           evidence=["health check on node3: Xid 79: GPU has fallen off the bus"], job="1",
                           campaign="alice-llm")  # fmt: skip
        wait_for("the reboot taken", lambda: [r for r in repairs(site) if r[1] == "reboot" and r[2] is None], 60)
        wait_for("node3 freshly booted", lambda: boot_time("node3") != booted, 60)
        wait_for("node3 back in service", lambda: "State=IDLE " in node_line("node3"), 60)
        wait_for("the loop's forgiveness", lambda: [k for n, k, _ in repairs(site) if n == "node3"][-1:] == ["forgive"],
                 60)  # fmt: skip
        assert [k for n, k, e in repairs(site) if n == "node3" and k != "wait"] == ["drain", "reboot", "forgive"]
        time.sleep(3)  # more rounds: the node stays in service (forgiven: the verdict no longer counts)
        assert "DRAIN" not in node_line("node3")
        assert SiteClient(url, read_token_file(tmp_path / "bob.token")).excluded() == []
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        subprocess.run(["scontrol", "update", "NodeName=node3", "State=RESUME"], capture_output=True, timeout=30)


def test_a_rebooted_node_its_health_check_finds_unfit_returns_only_once_the_check_passes(
        tmp_path: Path, rebootable: Path) -> None:  # fmt: skip
    """Slurm resumes the node after the reboot (nextstate=RESUME), its health check drains it again while the
    node stays unfit, and the loop does not forgive it: the verdict still keeps everyone off it. Once the check
    passes, the health check resumes it and the loop forgives it."""
    site = tmp_path / "site"
    url, server, first = start_site(site, REPO, "--repair", "--repair-every", "1", "--repair-max-share", "0.5")
    try:
        supervise("site", "token", "--dir", str(site), "--user", "alice", "--out", str(tmp_path / "alice.token"))
        supervise("site", "token", "--dir", str(site), "--user", "bob", "--out", str(tmp_path / "bob.token"))
        alice = SiteClient(url, read_token_file(tmp_path / "alice.token"))
        bob = SiteClient(url, read_token_file(tmp_path / "bob.token"))
        alice.post_verdict(node="node3", source="node", klass="hardware", confidence=0.95,
                           evidence=["health check on node3: Xid 79: GPU has fallen off the bus"], job="1",
                           campaign="alice-llm")  # fmt: skip
        wait_for("the reboot taken", lambda: [r for r in repairs(site) if r[1] == "reboot" and r[2] is None], 60)
        rebootable.touch()  # the node comes back from its reboot unfit (its slurmd starts a second later)
        wait_for("node3 drained again by its health check after the reboot",
                 lambda: "Reason=supervise: fs_free" in node_line("node3"), 60)  # fmt: skip
        time.sleep(12)  # more than its health-check interval and margin: rounds of the loop while the check fails
        assert [k for n, k, _ in repairs(site) if n == "node3" and k != "wait"] == ["drain", "reboot"]
        assert [n for n, _ in bob.excluded()] == ["node3"]  # the verdict still keeps everyone off it
        rebootable.unlink()  # repaired: the next check passes and resumes it
        wait_for("the loop's forgiveness", lambda: [k for n, k, _ in repairs(site) if n == "node3"][-1:] == ["forgive"],
                 60)  # fmt: skip
        assert "DRAIN" not in node_line("node3") and bob.excluded() == []
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
        subprocess.run(["scontrol", "update", "NodeName=node3", "State=RESUME"], capture_output=True, timeout=30)

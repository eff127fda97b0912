"""The site's repair loop through the real `scontrol` of the local Slurm (docs/site.md, `supervise site serve
--repair`): a node another user's node agent read an Xid 79 from is drained with the evidence as the reason; the
reboot that follows is refused by this cluster (no RebootProgram) and recorded once, the node staying drained for
a person; an operator's `supervise site forgive` returns it to service; a printed Xid line drains nothing."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
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

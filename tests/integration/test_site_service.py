"""`supervise site` as operators run it, real processes over loopback (docs/site.md): the service starts and writes
the operators' token, a user's token is issued into a private file, a campaign's client posts a hardware verdict,
another user's campaign is kept off the node, `site nodes` lists it, a user may not forgive it but an operator can,
and SIGTERM stops the service cleanly; its database outlives it."""

from __future__ import annotations

import json
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from site_tools import start_site

from supervisor.site.client import SiteClient, SiteUnavailable, read_token_file


def supervise(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=cwd)  # fmt: skip


def test_the_site_service_end_to_end(tmp_path: Path) -> None:
    site = tmp_path / "site"
    url, server, first = start_site(site, tmp_path)
    try:
        assert "site service on" in first
        assert stat.S_IMODE((site / "token").stat().st_mode) == 0o600
        for user in ("alice", "bob"):
            out = supervise("site", "token", "--dir", str(site), "--user", user, cwd=tmp_path)
            assert out.returncode == 0 and f"wrote {user}.site-token" in out.stdout, out.stderr
        alice = SiteClient(url, read_token_file(tmp_path / "alice.site-token"))
        bob = SiteClient(url, read_token_file(tmp_path / "bob.site-token"))
        alice.job_event("41", ["node1", "node2"], "alice-llm", "start")
        alice.post_verdict(node="node2", source="node", klass="hardware", confidence=0.95,
                           evidence=["Xid 79 on GPU 5 (NVML)"], job="41", campaign="alice-llm")  # fmt: skip
        assert [n for n, _ in bob.excluded()] == ["node2"]
        listed = supervise("site", "nodes", "--url", url, "--token-file", "bob.site-token", "--json", cwd=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert {r["node"]: r["failures"] for r in json.loads(listed.stdout)["nodes"]} == {"node1": 0, "node2": 1}
        refused = supervise("site", "forgive", "node2", "--url", url, "--token-file", "bob.site-token", cwd=tmp_path)
        assert refused.returncode == 9 and "403" in refused.stderr and len(refused.stderr.splitlines()) == 1
        ok = supervise("site", "forgive", "node2", "--url", url, "--token-file", str(site / "token"), cwd=tmp_path)
        assert ok.returncode == 0, ok.stderr
        assert bob.excluded() == []
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=30)
    assert code == 0
    with pytest.raises(SiteUnavailable):
        bob.excluded()
    again = supervise("site", "token", "--dir", str(site), "--user", "carol", cwd=tmp_path)
    assert again.returncode == 0  # the database outlived the service


def test_a_bad_listen_address_and_an_unreadable_database_are_one_line_errors(tmp_path: Path) -> None:
    bad = supervise("site", "serve", "--dir", str(tmp_path / "s"), "--listen", "8787", cwd=tmp_path)
    assert bad.returncode == 2 and "is not HOST:PORT" in bad.stderr
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "site.db").write_text("not a database " * 50)
    junk = supervise("site", "token", "--dir", str(tmp_path / "junk"), "--user", "alice", cwd=tmp_path)
    assert junk.returncode == 9 and "not a readable site database" in junk.stderr and len(junk.stderr.splitlines()) == 1

"""A campaign started with README's usage and a `[site]` table, on the real local Slurm, against a real `supervise
site serve` (docs/site.md): another user's hardware verdict read from a node keeps this campaign's job off that
node from its submission, and a verdict that arrives while it trains keeps its next launch off that node (the
spare takes over), with its own ledger empty; its Slurm run is told to the site (node-hours, the lemon rule's
exposure), and so are its state, its launches and its interruption (the fleet page's document); and a site
stopped mid-campaign does not stop the campaign. Another user's printed failures keep the job off a node only
once the lemon rule names it; the same user's earlier campaign's hardware verdict keeps the next one off it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from campaign_tools import REPO, cancel, launches, rank_pid, submit, supervise, wait_for
from site_tools import start_site

from supervisor.site.client import SiteClient, read_token_file

pytestmark = pytest.mark.slurm


def blamed_class(camp) -> str:  # type: ignore[no-untyped-def]
    return str(camp.of_type("interruption")[0]["class"])


def test_another_users_node_evidence_keeps_the_campaign_off_the_node(tmp_path: Path) -> None:
    site = tmp_path / "site"
    url, server, first = start_site(site, REPO)
    camp = None
    try:
        assert "site service on" in first
        for user in ("alice", "bob"):
            supervise("site", "token", "--dir", str(site), "--user", user, "--out", str(tmp_path / f"{user}.token"))
        alice = SiteClient(url, read_token_file(tmp_path / "alice.token"))
        alice.post_verdict(node="node2", source="node", klass="hardware", confidence=0.95,
                           evidence=["Xid 79 on GPU 0 (read by alice's node agent)"], job="1", campaign="alice-llm")
        # bob's campaign: 2 training nodes and a spare. The site's answer at submit keeps the job off node2
        camp = submit(tmp_path, steps=60, step_time=0.2, nodes=2,
                      config=f'spare_nodes = 1\n[site]\nurl = "{url}"\ntoken_file = "{tmp_path / "bob.token"}"\n')
        allocation = wait_for("the allocation", lambda: camp.of_type("attempt_started"), 180)[0]["nodes"]
        assert "node2" not in allocation, allocation
        first = wait_for("the first launch", lambda: launches(camp), 120)[0]
        # then a node of the running training gets a verdict from another user's campaign, read from the node:
        # the next launch (after a killed rank, nobody's fault) runs on the spare instead, bob's ledger still empty
        suspect = first["nodes"][1]
        alice.post_verdict(node=suspect, source="node", klass="hardware", confidence=0.95,
                           evidence=["ECC uncorrectable count rose (alice's node agent)"], job="2", campaign="alice-llm")
        pid = wait_for("rank 0 at step 5", lambda: rank_pid(camp, 0, 5), 120)
        os.kill(pid, signal.SIGKILL)
        relaunch = wait_for("the relaunch", lambda: launches(camp)[1:], 120)[0]
        assert suspect in relaunch["excluded"] and suspect not in relaunch["nodes"], relaunch
        told = [e for e in camp.of_type("site") if e["what"] == "excluded"]
        assert told and told[-1]["nodes"] == [suspect], camp.of_type("site")
        blamed = {n for e in camp.of_type("interruption") for n in e.get("blamed_nodes", [])}
        assert suspect not in blamed  # bob's own ledger: the site's word alone kept the node out
        listed = supervise("site", "nodes", "--url", url, "--token-file", str(tmp_path / "bob.token"), "--json")
        exposed = {r["node"] for r in json.loads(listed.stdout)["nodes"] if r["exposure_h"] is not None}
        assert set(allocation) <= exposed  # bob's Slurm run was told to the site (node-hours)
        fleet = SiteClient(url, read_token_file(site / "token")).request("GET", "/v1/fleet")  # the fleet page's
        [mine] = [c for c in fleet["campaigns"] if c["user"] == "bob"]
        assert mine["campaign"] == str(camp.root) and mine["state"] == "running" and mine["wall_s"] > 0, mine
        assert [a["klass"] for a in mine["attempts"]][:1] == [blamed_class(camp)]  # the killed launch, its class
        assert mine["last_interruption"]["class"] == blamed_class(camp)
        server.send_signal(signal.SIGTERM)  # the site goes away mid-campaign
        assert server.wait(timeout=30) == 0
        ended = wait_for("the campaign to complete", camp.ended, 180)
        assert ended["state"] == "completed", ended
        assert [e for e in camp.of_type("site") if e["what"] == "unavailable"]  # journaled, then went on
    finally:
        if server.poll() is None:
            server.kill()
        if camp is not None:
            cancel(camp.job_id)


def test_another_users_printed_failures_keep_a_campaign_off_a_node_only_once_the_lemon_rule_fires(
        tmp_path: Path) -> None:  # fmt: skip
    """node3 failed in jobs of two other users (text their programs printed: never enough alone) far more often
    than the fleet: a lemon, left out of bob's job from its submission; node4, with the same kind of evidence from
    one user, is not a lemon and stays in bob's allocation (bob asks for 3 of the 4 nodes)."""
    from supervisor.site.store import SiteStore

    site, now = tmp_path / "site", time.time()
    store = SiteStore(site)  # five days of jobs on the 4 nodes: the lemon rule's node-hours, before the service
    store.job_started("800", ["node1", "node2", "node3", "node4"], user="carol", campaign="moe", t=now - 5 * 86400)
    store.close()
    url, server, first = start_site(site, REPO)
    camp = None
    try:
        assert "site service on" in first
        for user in ("alice", "bob", "carol"):
            supervise("site", "token", "--dir", str(site), "--user", user, "--out", str(tmp_path / f"{user}.token"))
        users = {u: SiteClient(url, read_token_file(tmp_path / f"{u}.token")) for u in ("alice", "carol")}
        for user, node, job in (("alice", "node3", "11"), ("carol", "node3", "12"), ("alice", "node3", "13"),
                                ("carol", "node3", "14"), ("alice", "node3", "15"), ("alice", "node4", "16")):  # fmt: skip
            users[user].post_verdict(node=node, source="program", klass="app_error", confidence=0.6,
                                     evidence=["CUDA error: an illegal memory access was encountered"], job=job,
                                     campaign=f"{user}-llm")  # fmt: skip
        listed = supervise("site", "nodes", "--url", url, "--token-file", str(tmp_path / "bob.token"), "--json")
        lemons = {r["node"] for r in json.loads(listed.stdout)["nodes"] if r["lemon"]}
        assert lemons == {"node3"}, listed.stdout
        camp = submit(tmp_path, steps=40, step_time=0.2, nodes=3,
                      config=f'[site]\nurl = "{url}"\ntoken_file = "{tmp_path / "bob.token"}"\n')
        allocation = wait_for("the allocation", lambda: camp.of_type("attempt_started"), 180)[0]["nodes"]
        assert sorted(allocation) == ["node1", "node2", "node4"], allocation
    finally:
        server.kill()
        if camp is not None:
            cancel(camp.job_id)


def test_a_campaigns_hardware_verdict_keeps_the_same_users_next_campaign_off_the_node(tmp_path: Path) -> None:
    """Campaign A (bob) hits a hardware fault on one node (its rank there prints an Xid line: text, so it counts
    for bob only); bob's next campaign B is kept off that node from its first launch (submitted without it), with
    B's own ledger empty: the site's word alone."""
    from matrix_tools import mark_bad_node, submit_program

    site = tmp_path / "site"
    url, server, first = start_site(site, REPO)
    a = b = None
    try:
        assert "site service on" in first
        supervise("site", "token", "--dir", str(site), "--user", "bob", "--out", str(tmp_path / "bob.token"))
        config = f'[run]\nspare_nodes = 1\n[site]\nurl = "{url}"\ntoken_file = "{tmp_path / "bob.token"}"\n'
        a = submit_program(tmp_path, "--xid-on-bad-node", "3", steps=400, ckpt_every=2, nodes=2, config=config,
                           name="a")  # fmt: skip
        bad = mark_bad_node(a, 1)
        hit = wait_for("A's hardware interruption", lambda: [e for e in a.of_type("interruption")
                                                             if e["class"] == "hardware"], 150)[0]  # fmt: skip
        assert hit["blamed_nodes"] == [bad]
        bob = SiteClient(url, read_token_file(tmp_path / "bob.token"))
        wait_for("the site told", lambda: [n for n, _ in bob.excluded()] == [bad], 60)
        cancel(a.job_id)
        b = submit_program(tmp_path, steps=20, nodes=3, config=f'[site]\nurl = "{url}"\ntoken_file = '
                           f'"{tmp_path / "bob.token"}"\n', name="b")  # fmt: skip
        allocation = wait_for("B's allocation", lambda: b.of_type("attempt_started"), 180)[0]["nodes"]
        assert bad not in allocation and len(allocation) == 3, allocation
        first_launch = wait_for("B's first launch", lambda: launches(b), 150)[0]
        assert bad not in first_launch["nodes"]
        assert b.of_type("interruption") == [] and b.report()["excluded_nodes"] == []  # B's own ledger: empty
    finally:
        server.kill()
        for camp in (a, b):
            if camp is not None:
                cancel(camp.job_id)


def rpcs(kind: str) -> int:
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True, timeout=30).stdout
    section = out.split("Remote Procedure Call statistics by message type", 1)[-1].split("by user", 1)[0]
    found = re.search(rf"^\s+{kind}\s+\(\s*\d+\)\s+count:(\d+)", section, re.M)
    return int(found.group(1)) if found else 0


def test_a_campaign_with_a_site_polls_its_job_through_it_not_slurmctld(tmp_path: Path) -> None:
    """On the preemptible `batch` partition (GraceTime 10 s: the job is polled every 3 s), a campaign with
    `[site]` asks the site service, which reads every campaign's job with one squeue a round: in 30 s slurmctld
    sees about ten of those and almost none of the campaign's own single-job queries (about ten without a site)."""
    site = tmp_path / "site"
    url, server, first = start_site(site, REPO)
    camp = None
    try:
        assert "site service on" in first
        supervise("site", "token", "--dir", str(site), "--user", "bob", "--out", str(tmp_path / "bob.token"))
        camp = submit(tmp_path, steps=2000, step_time=0.2, nodes=1, sbatch=("--time=10", "--partition=batch"),
                      config=f'[site]\nurl = "{url}"\ntoken_file = "{tmp_path / "bob.token"}"\n')  # fmt: skip
        wait_for("the first launch", lambda: launches(camp), 150)
        time.sleep(10)  # the start-up queries are over; the site has read the job
        subprocess.run(["sdiag", "--reset"], check=True, capture_output=True, timeout=30)
        time.sleep(30)
        single, every = rpcs("REQUEST_JOB_INFO_SINGLE"), rpcs("REQUEST_JOB_INFO")
        assert single <= 2 and every >= 5, (single, every)
        assert camp.ended() is None  # still training: nothing stopped it
    finally:
        server.kill()
        if camp is not None:
            cancel(camp.job_id)

"""The fleet page as an operator opens it: `supervise site serve` as its own process, campaigns' figures, verdicts and
interruptions posted over HTTP with the campaigns' client (and an older history written to the service's own
database before it starts), the URL `supervise site url` prints opened in Debian's headless chromium. The page
loads with no console message at all (a script error or a blocked resource would log one), shows the rows this
test created (campaigns, the lemon first among the nodes, the repair loop's steps), escapes a campaign named
with markup, draws the chosen campaign's timeline when its link is followed, and draws the interruption chart in
each class's colour (the screenshot's pixels). The screenshot in docs/img/site-fleet.png is this test's picture.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import pytest
from site_tools import REPO, start_site

from supervisor.plot.timeline import colour
from supervisor.site.client import SiteClient, read_token_file
from supervisor.site.store import SiteStore

mpimg = pytest.importorskip("matplotlib.image")

MARKUP = "/scratch/mallory/<img src=x onerror=alert(1)>"


def seed_history(site: Path, now: float) -> None:
    """Five days of 16 nodes in jobs (the lemon rule's node-hours), and interruptions spread over two weeks."""
    store = SiteStore(site)
    store.job_started("900", [f"node{i:02d}" for i in range(1, 17)], user="carol", campaign="/scratch/carol/moe",
                      t=now - 5 * 86400)  # fmt: skip
    classes = ["preemption", "hardware", "hang", "node_failure", "preemption", "app_error", "comm_error"]
    for day in range(14):
        for k in range(day % 4 + 1):
            store.add_interruption(now - day * 86400 - k * 3000, "carol", "/scratch/carol/moe", "900",
                                   classes[(day + k) % len(classes)], [])  # fmt: skip
    store.add_repair(now - 7200, "node11", "drain", "supervise-site: Xid 79 (GPU fell off the bus)")
    store.add_repair(now - 7100, "node11", "reboot", "supervise-site: Xid 79 (GPU fell off the bus)")
    store.close()


def post_campaigns(url: str, alice: Path, bob: Path, now: float) -> None:
    a, b = SiteClient(url, read_token_file(alice)), SiteClient(url, read_token_file(bob))
    for who, campaign, state, ettr in ((a, "/scratch/alice/llama-70b", "running", 0.93),
                                       (b, "/scratch/bob/vit-huge", "completed", 0.88), (b, MARKUP, "failed", 0.41)):
        who.request("POST", "/v1/campaigns", {
            "campaign": campaign, "job": "4242", "state": state, "reason": "", "wall_s": 86400.0,
            "productive_s": 86400.0 * ettr, "ettr": ettr,
            "attempts": [{"start": now - 86400, "end": now - 50000, "klass": "hardware", "blamed": ["node07"]},
                         {"start": now - 49000, "end": now - 20000, "klass": "preemption", "blamed": []},
                         {"start": now - 19000, "end": None if state == "running" else now - 100,
                          "klass": None if state == "running" else "completed", "blamed": []}]})  # fmt: skip
    for who, job in ((a, "4242"), (b, "4243"), (a, "4244")):  # node07 fails for two users' jobs: a lemon
        who.request("POST", "/v1/verdicts", {"node": "node07", "source": "program", "klass": "app_error",
                                             "confidence": 0.6, "evidence": ["CUDA error: an illegal memory access"],
                                             "job": job, "campaign": "x"})  # fmt: skip
        who.request("POST", "/v1/interruptions", {"campaign": "/scratch/alice/llama-70b", "job": job,
                                                  "klass": "hardware", "nodes": ["node07"]})  # fmt: skip


def browse(chromium: str, url: str, profile: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
                           "--virtual-time-budget=8000", *flags, url], capture_output=True, text=True,
                          timeout=180)  # fmt: skip


def console(out: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in out.stderr.splitlines() if ":CONSOLE" in line]


def pixels_near(png: Path, hex_colour: str) -> int:
    rgb = [int(hex_colour.lstrip("#")[i: i + 2], 16) / 255 for i in (0, 2, 4)]
    image = mpimg.imread(str(png))[..., :3]
    return int((abs(image - rgb).max(axis=-1) < 0.03).sum())


def test_the_fleet_page_in_headless_chromium(tmp_path: Path, chromium: str) -> None:
    now = time.time()
    site = tmp_path / "site"
    seed_history(site, now)
    url, server, first = start_site(site, tmp_path)
    try:
        assert "site service on" in first, first
        tokens = {}
        for user in ("alice", "bob"):
            tokens[user] = tmp_path / f"{user}.token"
            subprocess.run([sys.executable, "-m", "supervisor.cli", "site", "token", "--dir", str(site), "--user",
                            user, "--out", str(tokens[user])], check=True, cwd=REPO, capture_output=True)  # fmt: skip
        post_campaigns(url, tokens["alice"], tokens["bob"], now)
        printed = subprocess.run([sys.executable, "-m", "supervisor.cli", "site", "url", "--url", url, "--token-file",
                                  str(site / "token")], check=True, cwd=REPO, capture_output=True, text=True)  # fmt: skip
        page = printed.stdout.strip()
        assert page.startswith(url + "/#key=")

        out = browse(chromium, page, tmp_path / "profile", "--dump-dom")
        assert out.returncode == 0, out.stderr[-2000:]
        assert console(out) == [], console(out)
        dom = out.stdout
        campaigns = re.findall(r'<tr data-campaign="([^"]*)"', dom)
        assert len(campaigns) == 3 and "alice:/scratch/alice/llama-70b" in campaigns, campaigns
        assert "&lt;img src=x onerror=alert(1)&gt;" in dom and "<img src=x" not in dom  # a name, not markup
        nodes = re.findall(r'<tr (?:class="lemon" )?data-node="([^"]*)"', dom)
        assert nodes[0] == "node07" and 'class="lemon" data-node="node07"' in dom, nodes
        assert re.search(r'data-node="node11"><td>node11</td><td>rebooting</td>', dom)
        assert "93.0 %" in dom and "supervise-site: Xid 79" in dom
        assert 'id="campaign-timeline"' not in dom  # drawn only when a campaign's link is followed

        chosen = page + "&campaign=" + urllib.parse.quote("alice:/scratch/alice/llama-70b", safe="")
        out = browse(chromium, chosen, tmp_path / "profile", "--dump-dom")
        assert console(out) == [], console(out)
        picture = out.stdout[out.stdout.index('id="campaign-timeline"'):]
        picture = picture[:picture.index("</svg>")]
        assert picture.count("<rect") == 3 and colour("hardware") in picture and colour("running") in picture
        assert "supervise report /scratch/alice/llama-70b --plot timeline.html" in out.stdout

        shot = tmp_path / "fleet.png"
        out = browse(chromium, chosen, tmp_path / "profile", f"--screenshot={shot}", "--window-size=1300,1500")
        assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
        assert console(out) == [], console(out)
        for klass in ("preemption", "hardware", "hang", "app_error"):  # the chart's bars in each class's colour
            assert pixels_near(shot, colour(klass)) > 150, klass
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_page_says_what_to_do_without_a_key_and_with_a_wrong_one(tmp_path: Path, chromium: str) -> None:
    url, server, _ = start_site(tmp_path / "site", tmp_path)
    try:
        out = browse(chromium, url + "/", tmp_path / "profile", "--dump-dom")
        assert console(out) == [] and "supervise site url" in out.stdout
        out = browse(chromium, url + "/#key=site-admin.1.00", tmp_path / "profile", "--dump-dom")
        assert 'class="bad"' in out.stdout and "view key is malformed" in out.stdout
    finally:
        server.terminate()
        server.wait(timeout=30)

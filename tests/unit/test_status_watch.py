"""`supervise status --watch` on a finished campaign: it draws the table once and exits with the campaign's
outcome; on a running one it keeps refreshing until the journal says the campaign ended."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.decisions import events as ev
from supervisor.heartbeat.live import write_private_json
from supervisor.journal import Journal

LIVE = {"job": "4242", "nodes": [{"node": "node1", "staleness_s": 0.2}], "ranks_total": 2, "counters": {},
        "events": [], "ranks": [
            {"rank": 0, "node": "node1", "pid": 101, "step": 50, "phase": "step", "steps_per_s": 2.0,
             "beat_age_s": 0.4, "state": "running"},
            {"rank": 1, "node": "node1", "pid": 102, "step": 48, "phase": "step", "steps_per_s": None,
             "ewma_steps_per_s": 1.5, "beat_age_s": 41.0, "state": "stopped"}]}  # fmt: skip


def _campaign(tmp_path: Path, end: str | None) -> Path:
    root = tmp_path / "campaign"
    root.mkdir(mode=0o700)
    with Journal(root / "journal.jsonl") as journal:
        journal.append(ev.campaign_started(1000.0, str(root), ["python", "train.py"], "4242"))
        journal.append(ev.attempt_started(1001.0, "4242", 0, ["node1"], None))
        if end:
            journal.append(ev.attempt_ended(1100.0, "4242", ev.COMPLETED if end == "completed" else ev.APP_ERROR))
            journal.append(ev.campaign_ended(1100.0, end, "done" if end == "completed" else "app error"))
    write_private_json(root / "live.json", LIVE)
    return root


def _watch(root: Path, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor.cli", "status", str(root), "--watch", "--interval", "0.2",
                           *extra], capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "COLUMNS": "120"})  # fmt: skip


@pytest.mark.parametrize(("end", "code"), [("completed", 0), ("failed", 1)])
def test_finished_campaign_draws_once_and_exits_with_its_outcome(tmp_path: Path, end: str, code: int) -> None:
    proc = _watch(_campaign(tmp_path, end))
    assert proc.returncode == code, proc.stderr
    assert f"state {end}" in proc.stdout
    assert "node1" in proc.stdout and "stopped" in proc.stdout and "41.0" in proc.stdout


def test_running_campaign_is_watched_until_it_ends(tmp_path: Path) -> None:
    root = _campaign(tmp_path, None)
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "status", str(root), "--watch", "--interval",
                             "0.2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        time.sleep(1.5)  # several refresh periods of a running campaign
        assert proc.poll() is None, "--watch must keep going while the campaign runs"
        with Journal(root / "journal.jsonl") as journal:
            journal.append(ev.campaign_ended(1200.0, "completed", "done"))
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_rich_view_renders_the_table() -> None:
    pytest.importorskip("rich")
    from rich.console import Console

    from supervisor.commands.status_watch import rich_view

    doc = {**LIVE, "campaign": "/runs/c", "live_age_s": 0.5,
           "summary": {"state": "running", "reason": "", "attempts": 1, "last_attempt": None}}  # fmt: skip
    console = Console(record=True, width=120)
    console.print(rich_view(doc))
    text = console.export_text()
    assert "state running" in text and "steps/s" in text and "1.50" in text  # EWMA when no interval rate


def test_watch_and_json_do_not_mix(tmp_path: Path) -> None:
    proc = _watch(_campaign(tmp_path, "completed"), "--json")
    assert proc.returncode == 2 and "cannot be combined" in proc.stderr


@pytest.mark.parametrize("end", [None, "completed"])
def test_the_table_of_an_ended_campaign_says_it_is_the_last_one_seen(tmp_path: Path, end: str | None) -> None:
    """After the end, live.json still holds the ranks as they last ran ("running"): the table says so."""
    proc = subprocess.run([sys.executable, "-m", "supervisor.cli", "status", str(_campaign(tmp_path, end))],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    said = "the campaign has ended: the ranks as its supervisor last saw them" in proc.stdout
    assert said == (end is not None), proc.stdout

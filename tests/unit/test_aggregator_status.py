"""``supervise status``: reads what the aggregator wrote; clear exit 7 on a missing campaign."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from supervisor.cli import main
from supervisor.heartbeat import wire
from supervisor.heartbeat.live import live_document, write_private_json
from supervisor.heartbeat.table import LiveTable

KEY = wire.derive_key(b"q" * 32)


def _write_live(campaign: Path) -> None:
    table = LiveTable(KEY, "77", rate_window_s=1.0)
    now = time.time_ns()
    for seq, (mono, step) in enumerate([(0, 0), (1, 10), (2, 20)], start=1):
        ranks = [wire.RankEntry(r, 100 + r, step + r, 1, wire.ST_RUNNING if r else wire.ST_STOPPED, 0, 0, 50,
                                0.1, 0.1, 0.1, float("nan") if r else 0.5, step, step, -1, 0, 1.0,
                                own_s=0.25 if r else 0.0) for r in (0, 1)]  # fmt: skip
        table.feed(wire.encode_summary(KEY, instance=1, seq=seq, wall_ns=now, mono_ns=mono * 10**9, job="77",
                                       node="node1", ranks=ranks))
    write_private_json(campaign / "live.json", live_document(table.snapshot()))


def test_status_json_shows_per_rank_rates(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_live(tmp_path)
    assert main(["status", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["job"] == "77" and doc["live_age_s"] < 60
    assert [(r["rank"], r["node"], r["step"], r["steps_per_s"], r["state"]) for r in doc["ranks"]] == [
        (0, "node1", 20, 10.0, "stopped"), (1, "node1", 21, 10.0, "running")]
    assert doc["ranks"][1]["loss"] == "nan"


def test_status_table_lists_every_rank(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _write_live(tmp_path)
    assert main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out if line.split() and line.split()[0].isdigit()]
    assert [(r[0], r[1], r[3], r[5], r[6], r[-1]) for r in rows] == [("0", "node1", "20", "10.00", "-", "stopped"),
                                                                     ("1", "node1", "21", "10.00", "0.250", "running")]


def test_status_before_any_live_data_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", str(tmp_path)]) == 0
    assert "no live data yet" in capsys.readouterr().out


def test_status_of_a_missing_campaign_exits_7_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["status", str(tmp_path / "nope")]) == 7
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and "supervise submit" in err


def test_status_of_a_corrupt_live_file_exits_7(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "live.json").write_text("{not json")
    assert main(["status", str(tmp_path)]) == 7
    assert "not a valid live status file" in capsys.readouterr().err

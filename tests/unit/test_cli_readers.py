"""The CLI's readers of the campaign's private files (issue 22, low): a torn, hand-edited or odd file gets one
line naming the problem and a distinct exit code, never a traceback. The real ``supervise`` entry point."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from supervisor import campaign, cli, stop_request
from supervisor.errors import CampaignError
from supervisor.journal import Journal


def _supervise(*argv: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err


@pytest.fixture
def camp(tmp_path: Path) -> Path:
    paths = campaign.create(tmp_path / "c", campaign.CampaignSpec(command=("python", "train.py")), "#!/bin/sh\n")
    with Journal(paths.journal) as j:
        j.append({"type": "campaign_started", "t": 1.0, "campaign": str(paths.root), "command": ["x"],
                  "job_id": "7"})  # fmt: skip
    return paths.root


@pytest.mark.parametrize("content", [
    b"\xff\xfe not utf-8 \x80",  # status printed a UnicodeDecodeError traceback
    b"[" * 100000,  # nesting deeper than the parser's recursion
    json.dumps({"ranks": [{"rank": "zero"}], "nodes": []}).encode(),  # a rank row of the wrong types
    json.dumps({"ranks": [], "nodes": [5]}).encode(),
])  # fmt: skip
def test_status_of_an_odd_live_file_is_one_line(camp: Path, content: bytes, capsys) -> None:
    (camp / "live.json").write_bytes(content)
    code, err = _supervise("status", str(camp), capsys=capsys)
    assert code == CampaignError.exit_code and "is not a valid live status file" in err and err.count("\n") == 1


@pytest.mark.parametrize("change", [
    {"command": 5}, {"command": ["python", 3]}, {"command": []}, {"sbatch_flags": "--nodes=2"},
    {"config": ["run"]}, {"cwd": 7}, {"created": "yesterday"},
])  # fmt: skip
def test_an_odd_campaign_spec_is_one_line(camp: Path, change: dict, capsys) -> None:
    spec = json.loads((camp / "campaign.json").read_text())
    (camp / "campaign.json").write_text(json.dumps({**spec, **change}))
    for command in (("report", str(camp)), ("nodes", str(camp)), ("cancel", str(camp))):
        code, err = _supervise(*command, capsys=capsys)
        assert code == CampaignError.exit_code and "is not a campaign spec this supervisor wrote" in err, command


@pytest.mark.parametrize("content", ["[" * 100000, '{"t": 1' + "0" * 400 + ', "checkpoint": true}',
                                     '{"t": 1e999}', "\udcff"])  # fmt: skip
def test_an_odd_stop_request_is_still_a_request_to_stop(tmp_path: Path, content: str) -> None:
    """It escaped as RecursionError / OverflowError from the running supervisor's watch."""
    path = stop_request.path(tmp_path)
    path.write_bytes(content.encode(errors="surrogateescape"))
    got = stop_request.read(tmp_path)
    assert got is not None and got.t == 0.0  # an unreadable request is still a request to stop (no time known)


def test_slurm_durations_of_absurd_length_are_not_durations() -> None:
    from slurm.parse_config import seconds

    assert seconds("9" * 5000) is None and seconds("9" * 5000 + ":00:00") is None  # int() raised before
    assert seconds("2 min") == 120.0 and seconds("1-00:00:30") == 86430.0


def test_the_readers_still_read_what_the_supervisor_writes(camp: Path, capsys) -> None:
    (camp / "live.json").write_text(json.dumps({"job": "7", "ranks": [
        {"rank": 0, "node": "n1", "pid": 11, "step": 5, "phase": "step", "state": "running", "steps_per_s": 2.0,
         "beat_age_s": 0.1}], "nodes": [{"node": "n1", "staleness_s": 0.5}], "counters": {}}))  # fmt: skip
    os.utime(camp / "live.json")
    code, _ = _supervise("status", str(camp), capsys=capsys)
    assert code == 0

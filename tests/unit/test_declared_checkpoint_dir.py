"""Resume behind wrappers (issue 27): the program says where it saves (``client.saves_to``, called by
``CheckpointSaver`` and the Lightning callback); the supervisor adopts it when no flag or config named one, once,
journaled; a shell's ``-c`` string is read as the command it runs. The declaration is the program's text: any
content parses to a directory or to nothing, never an exception."""

from __future__ import annotations

import json
import os
import stat
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor import client
from supervisor.checkpoint.locate import checkpoint_dir_from_argv, parse_declaration, shell_command
from supervisor.decisions import events as ev
from supervisor.driver.checkpoint_tracker import CheckpointTracker
from supervisor.driver.context import Context
from supervisor.paths import CampaignPaths


@pytest.mark.parametrize(("argv", "expected"), [
    (["bash", "-c", "torchrun --nproc-per-node 2 train.py --ckpt-dir /scratch/ck"], "/scratch/ck"),
    (["/bin/bash", "-lc", "cd /w && exec python train.py --save=/s/m # a comment"], "/s/m"),
    (["sh", "-ec", "python train.py --output_dir out"], "out"),
    (["bash", "-c", "python train.py 'unbalanced"], None),  # shlex cannot split it: nothing, no error
    (["bash", "-c", "bash -c 'python t.py --ckpt-dir /deep'"], "/deep"),
    (["bash", "run.sh"], None),  # a wrapper script: only the program can say (client.saves_to)
])  # fmt: skip
def test_a_shells_command_string_is_read_as_the_command_it_runs(argv, expected):
    assert checkpoint_dir_from_argv(argv) == expected
    assert shell_command(["python", "-c", "x"]) is None


@given(st.text(max_size=300))
def test_any_declaration_text_is_a_directory_or_nothing(text):
    got = parse_declaration(text)
    assert got is None or (got.startswith("/") and "\x00" not in got and "\n" not in got)


def test_declarations_parse_to_their_normalised_absolute_directory():
    assert parse_declaration('{"path": "/a/b/../c/", "rank": 0}') == "/a/c"
    for bad in ('{"path": "rel/dir"}', '{"path": 3}', "[1]", "/a/b", '{"path": "/a\\u0000b"}',
                json.dumps({"path": "/" + "x" * 5000}), '{"path": "/a\\nb"}'):  # fmt: skip
        assert parse_declaration(bad) is None, bad


@pytest.fixture
def campaign(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "campaign"
    root.mkdir(mode=0o700)
    for name in ("RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SUPERVISOR_CAMPAIGN", str(root))
    return root


def test_rank_0_declares_once_and_the_file_is_private(campaign: Path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RANK", "0")
    assert client.saves_to("ckpt") is True
    target = CampaignPaths(campaign).declared_checkpoint_dir
    assert json.loads(target.read_text()) == {"path": str(tmp_path / "ckpt"), "rank": 0}
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    before = target.stat().st_mtime_ns
    assert client.saves_to(tmp_path / "ckpt") is True and target.stat().st_mtime_ns == before  # unchanged: kept
    monkeypatch.setenv("RANK", "1")
    assert client.saves_to("/elsewhere") is False  # one program, one directory: rank 0's
    assert parse_declaration(target.read_text()) == str(tmp_path / "ckpt")
    assert not [p for p in campaign.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_unsupervised_or_unwritable_declares_nothing_and_training_goes_on(campaign: Path, monkeypatch, capsys):
    monkeypatch.delenv("SUPERVISOR_CAMPAIGN")
    assert client.saves_to("/x") is False
    monkeypatch.setenv("SUPERVISOR_CAMPAIGN", str(campaign / "missing"))
    assert client.saves_to("/x") is False
    assert "cannot tell the supervisor where checkpoints are" in capsys.readouterr().err


def test_the_tracker_adopts_the_declared_directory_once_and_resumes_from_it(campaign: Path, tmp_path: Path):
    events: list[dict] = []
    declared = CampaignPaths(campaign).declared_checkpoint_dir
    tracker = CheckpointTracker(Context.of(events.append), "", declared=declared)
    assert not tracker.known() and tracker.pick_resume() == (None, None) and events == []
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir(mode=0o700)
    with zipfile.ZipFile(ckpt / "checkpoint-7.pt", "w", zipfile.ZIP_STORED) as zf:  # torch.save's format
        zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        zf.writestr("archive/version", b"3\n")
    os.environ["RANK"] = "0"
    try:
        assert client.saves_to(ckpt)
    finally:
        del os.environ["RANK"]
    assert tracker.known() and tracker.checkpoint_dir == str(ckpt)
    path, step = tracker.pick_resume()
    assert step == 7 and path == str(ckpt / "checkpoint-7.pt")
    kinds = [e["type"] for e in events]
    assert kinds.count(ev.CHECKPOINT_DIR_DECLARED) == 1 and events[0]["path"] == str(ckpt)
    named = CheckpointTracker(Context.of(events.append), "/configured", declared=declared)
    assert named.known() and named.checkpoint_dir == "/configured"  # a flag or the config wins

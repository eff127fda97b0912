"""Where checkpoints live when nobody configured it: the training argv's usual flags (issue 9, item 1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.checkpoint.locate import DIR_FLAGS, checkpoint_dir_from_argv, resolve_checkpoint_dir
from supervisor.commands import submit


@pytest.mark.parametrize(("argv", "expected"), [
    (["python", "train.py", "--ckpt-dir", "/scratch/ckpt"], "/scratch/ckpt"),
    (["python", "train.py", "--ckpt-dir=/scratch/ckpt"], "/scratch/ckpt"),
    (["python", "pretrain_gpt.py", "--save", "/s/megatron", "--load", "/s/megatron"], "/s/megatron"),
    (["python", "run_clm.py", "--output_dir", "out"], "out"),
    (["python", "run_clm.py", "--output-dir=out"], "out"),
    (["python", "fit.py", "--default-root-dir", "/r"], "/r"),
    (["python", "fit.py", "--checkpoint-dir", "c1"], "c1"),
    (["python", "main.py", "ckpt_path=/x/epoch=3-step=100.ckpt"], "/x"),
    (["python", "main.py", "+ckpt_path=/x/y"], "/x/y"),
    (["python", "main.py", "ckpt_path=last"], None),
    (["python", "train.py", "--ckpt-dir", "a", "--ckpt-dir", "b"], "b"),  # argparse: the last one counts
    (["python", "train.py", "--output-dir", "o", "--ckpt-dir", "c"], "c"),  # the more specific flag wins
    (["python", "train.py", "--ckpt-dir"], None),  # no value
    (["python", "train.py", "--ckpt-dir", "--steps", "3"], None),  # the next token is a flag, not a value
    (["python", "train.py", "--", "--ckpt-dir", "x"], None),  # positional after --
    (["python", "train.py", "--steps", "3"], None),
    (["python", "train.py", "--ckpt-dirs", "x"], None),  # a different flag
])
def test_checkpoint_dir_is_read_from_the_usual_flags(argv, expected):
    assert checkpoint_dir_from_argv(argv) == expected


def test_precedence_flag_then_config_then_argv_and_relative_paths_from_cwd():
    argv = ["python", "t.py", "--ckpt-dir", "ck"]
    assert resolve_checkpoint_dir("/explicit", "/conf", argv, "/work") == "/explicit"
    assert resolve_checkpoint_dir(None, "/conf", argv, "/work") == "/conf"
    assert resolve_checkpoint_dir(None, "", argv, "/work") == "/work/ck"
    assert resolve_checkpoint_dir(None, "", ["python", "t.py"], "/work") == ""


_word = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)


@settings(max_examples=300, derandomize=True)
@given(before=st.lists(_word, max_size=6), flag=st.sampled_from(DIR_FLAGS),
       value=st.from_regex(r"/[a-z0-9_]{1,10}(/[a-z0-9_]{1,10}){0,3}", fullmatch=True), eq=st.booleans())
def test_a_named_directory_is_always_found_and_parsing_never_raises(before, flag, value, eq):
    before = [w for w in before if w != "--" and w.partition("=")[0] not in (*DIR_FLAGS, "ckpt_path", "+ckpt_path",
                                                                             "checkpoint_dir", "ckpt_dir")]
    tail = [f"{flag}={value}"] if eq else [flag, value]
    # Other flags before it are ignored (a flag with no value followed by ours never swallows it).
    assert checkpoint_dir_from_argv([*before, *tail]) == value


@settings(max_examples=300, derandomize=True)
@given(st.lists(_word, max_size=10))
def test_any_argv_gives_a_string_or_none(argv):
    found = checkpoint_dir_from_argv(argv)
    assert found is None or (isinstance(found, str) and found)


def _build(argv, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = submit.parse_argv(argv)
    args.python = "/opt/venv/bin/python"
    return submit.build(args, now=0.0)


def test_submit_records_the_checkpoint_dir_of_the_readme_usage(tmp_path, monkeypatch):
    _, spec, _, _ = _build(["-N", "2", "--campaign", "/c/x", "--", "python", "train.py", "--ckpt-dir", "ck"],
                           tmp_path, monkeypatch)
    assert spec.config["run"]["checkpoint_dir"] == str(tmp_path / "ck")


def test_submit_checkpoint_dir_flag_wins_over_config_and_argv(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[run]\ncheckpoint_dir = "/from/config"\n')
    argv = ["--config", str(cfg), "--campaign", "/c/x", "--", "python", "t.py", "--save", "/from/argv"]
    _, spec, _, _ = _build(argv, tmp_path, monkeypatch)
    assert spec.config["run"]["checkpoint_dir"] == "/from/config"
    _, spec, _, flags = _build(["--checkpoint-dir", "/from/flag", *argv], tmp_path, monkeypatch)
    assert spec.config["run"]["checkpoint_dir"] == "/from/flag"
    assert "--checkpoint-dir" not in flags  # ours, not passed to sbatch


def test_submit_says_once_that_resume_is_off_when_nothing_names_a_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(submit, "_submit", lambda paths, flags: "123")
    assert submit.run(submit.parse_argv(["--campaign", str(tmp_path / "c"), "--", "python", "t.py"])) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "resume is off" in err and "--checkpoint-dir" in err
    assert submit.run(submit.parse_argv(["--campaign", str(tmp_path / "d"), "--", "python", "t.py",
                                         "--ckpt-dir", "x"])) == 0
    assert "resume is off" not in capsys.readouterr().err


def test_submit_notes_a_checkpoint_root_others_can_write(tmp_path, monkeypatch, capsys):
    import os

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(submit, "_submit", lambda paths, flags: "123")
    (tmp_path / "ck").mkdir()
    os.chmod(tmp_path / "ck", 0o777)
    assert submit.run(submit.parse_argv(["--campaign", str(tmp_path / "c"), "--", "python", "t.py",
                                         "--ckpt-dir", "ck"])) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writable by other users" in err and "chmod -R go-w" in err

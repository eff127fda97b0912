"""The batch script `supervise submit` writes: pinned by a golden file, and its flag policing."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.cli import main
from supervisor.commands import submit
from supervisor.errors import UsageError

GOLDEN = Path(__file__).parent.parent / "golden" / "batch.sh"


def _build(argv: list[str]):
    args = submit.parse_argv(argv)
    args.python = "/opt/venv/bin/python"
    return submit.build(args, now=0.0)


def test_batch_script_matches_golden_file():
    root, spec, script, flags = _build(
        ["-N", "2", "--ntasks-per-node=2", "--time=01:00:00", "--campaign", "/campaigns/golden", "--",
         "python", "train.py", "--steps", "100"]
    )
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.write_text(script)
    assert script == GOLDEN.read_text()
    assert root == Path("/campaigns/golden")
    assert flags == ["-N", "2", "--ntasks-per-node=2", "--time=01:00:00"]
    # The command never enters the shell script; it is data in campaign.json.
    assert spec.command == ("python", "train.py", "--steps", "100")
    assert "train.py" not in script


def test_user_job_name_is_kept_and_not_duplicated():
    _, _, script, flags = _build(["-J", "llama", "--campaign", "/c/x", "--", "true"])
    assert "--job-name" not in script
    assert flags == ["-J", "llama"]


def test_signal_lead_comes_from_config(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[submit]\nsignal_lead_s = 300\n")
    _, _, script, _ = _build(["--config", str(cfg), "--campaign", "/c/x", "--", "true"])
    assert "#SBATCH --signal=B:USR1@300\n" in script


@pytest.mark.parametrize("flag", ["--signal=USR1@60", "--no-requeue", "-o", "--output=x.log", "--wrap=true", "--array=1-3"])
def test_conflicting_sbatch_flags_are_refused_with_a_fix(flag, capsys):
    assert main(["submit", flag, "--campaign", "/c/x", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert flag in err and "fix:" in err and err.count("\n") == 1


def test_missing_command_is_a_usage_error():
    with pytest.raises(UsageError, match="no training command"):
        submit.parse_argv(["-N", "2"])
    with pytest.raises(UsageError, match="empty"):
        submit.parse_argv(["-N", "2", "--"])


def test_unsafe_campaign_path_is_refused(capsys):
    assert main(["submit", "--dry-run", "--campaign", "/tmp/has space", "--", "true"]) == 2
    assert "campaign directory" in capsys.readouterr().err


def test_dry_run_writes_nothing(tmp_path, capsys):
    target = tmp_path / "camp"
    assert main(["submit", "--dry-run", "--campaign", str(target), "--", "true"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash\n") and "sbatch --parsable" in out
    assert not target.exists()



def test_spare_nodes_allocate_n_plus_k_and_survive_a_node_failure(tmp_path):
    # The job asks for N+K nodes and keeps running when one fails (--no-kill); the batch host's own loss is the
    # agents' failsafe's (docs/node-loss.md).
    cfg = tmp_path / "c.toml"
    cfg.write_text("[run]\nspare_nodes = 1\n")
    for ours, wanted in ((["-N", "2"], ["-N", "3"]), (["-N2"], ["-N3"]), (["--nodes=2-4"], ["--nodes=3-5"]),
                          ([], ["--nodes=2"])):  # fmt: skip
        _, _, script, flags = _build(["--config", str(cfg), *ours, "--campaign", "/c/x", "--", "true"])
        assert flags == [*wanted, "--no-kill"]
    _, _, _, flags = _build(["--config", str(cfg), "-N2", "-k", "--campaign", "/c/x", "--", "true"])
    assert flags == ["-N3", "-k"]
    _, _, _, flags = _build(["-N2", "--campaign", "/c/x", "--", "true"])  # no spares: untouched
    assert flags == ["-N2"]


def test_spare_nodes_refuse_a_total_task_count(tmp_path):
    from supervisor.errors import UsageError

    cfg = tmp_path / "c.toml"
    cfg.write_text("[run]\nspare_nodes = 1\n")
    with pytest.raises(UsageError, match="--ntasks"):
        _build(["--config", str(cfg), "-N2", "--ntasks=2", "--campaign", "/c/x", "--", "true"])


@pytest.mark.parametrize("name", ["x\n/usr/bin/id > f\n#", "a b", "", "x" * 129, "tab\there", "ü"])
def test_a_job_name_that_could_escape_its_directive_is_refused(tmp_path, capsys, name):
    """Issue 10 finding 4: `submit.job_name = "x\\n/usr/bin/id > f\\n#"` became a shell line of the batch script."""
    cfg = tmp_path / "c.toml"
    cfg.write_text(f"[submit]\njob_name = {json.dumps(name)}\n")
    assert main(["submit", "--config", str(cfg), "--campaign", str(tmp_path / "c"), "--dry-run", "--", "true"]) == 3
    assert main(["submit", "-J", name, "--campaign", str(tmp_path / "c"), "--dry-run", "--", "true"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "/usr/bin/id" not in capsys.readouterr().out


@pytest.mark.parametrize("directive", ["--comment=a\nb", "--job-name=a;b", "--x=\x00", "--x=a\rb", "-Jbad name"])
def test_render_script_refuses_unsafe_directives(directive):
    from slurm.sbatch import SbatchFlagError, render_script

    with pytest.raises(SbatchFlagError):
        render_script([directive], [["true"]])


@settings(max_examples=300, derandomize=True)
@given(st.text(max_size=40))
def test_any_accepted_directive_is_exactly_one_sbatch_line(value):
    from slurm.sbatch import SbatchFlagError, render_script

    try:
        script = render_script([f"--comment={value}"], [["true"]])
    except SbatchFlagError:
        return
    assert script.count("\n") == 3 and f"#SBATCH --comment={value}\n" in script

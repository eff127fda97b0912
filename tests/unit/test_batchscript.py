"""`supervise submit --script job.sbatch`: an existing batch script adopted (#SBATCH and set-up lines kept, the
srun line wrapped), pinned by a golden file; what cannot be adopted faithfully is one line with a fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from supervisor import batchscript
from supervisor.cli import main
from supervisor.commands import submit
from supervisor.errors import UsageError

GOLDEN = Path(__file__).parent.parent / "golden"


def _build(script: Path, *flags: str):
    args = submit.parse_argv([*flags, "--script", str(script), "--campaign", "/campaigns/llama"])
    args.python = "/opt/venv/bin/python"
    return submit.build(args, now=0.0)


def test_an_adopted_script_matches_the_golden_file(monkeypatch):
    monkeypatch.chdir(GOLDEN)
    root, spec, text, flags = _build(Path("user-job.sbatch"), "--account=ml")
    if os.environ.get("UPDATE_GOLDEN"):
        (GOLDEN / "user-job.batch.sh").write_text(text)
    assert text == (GOLDEN / "user-job.batch.sh").read_text()
    assert spec.command == ("python", "train.py", "--config", "configs/7b run.yaml", "--ckpt-dir", "/scratch/llama/ckpt")
    assert spec.config["run"]["srun_args"] == ["--cpu-bind=cores", "--mpi=pmix"]
    assert spec.config["run"]["checkpoint_dir"] == "/scratch/llama/ckpt"  # from the srun line's command
    assert spec.sbatch_flags == ("--nodes=2", "--ntasks-per-node=4", "--time=24:00:00", "-J", "llama",
                                 "--gres=gpu:4", "--account=ml")  # fmt: skip
    assert flags == ["--account=ml"] and spec.cwd == ""  # the batch step's cwd after the script's own `cd`
    assert "train.py" not in text and "--job-name" not in text


def _script(tmp_path: Path, body: str, directives: str = "#SBATCH -N 2\n#SBATCH --ntasks-per-node=1\n") -> Path:
    path = tmp_path / "job.sbatch"
    path.write_text("#!/bin/bash\n" + directives + body)
    return path


@pytest.mark.parametrize(("directives", "body", "words"), [
    ("#SBATCH -N 2\n#SBATCH --output=x.log\n", "srun python t.py\n", ["--output", "logs go to"]),
    ("#SBATCH -N 2\n", "python t.py\n", ["no srun line", "exactly one"]),
    ("#SBATCH -N 2\n", "srun hostname\nsrun python t.py\n", ["2 srun lines", "lines 3, 4"]),
    ("#SBATCH -N 2\n", "srun python t.py --out $SCRATCH/x\n", ["'$' expansion", "export"]),
    ("#SBATCH -N 2\n", "srun python t.py | tee log\n", ["'|'", "data"]),
    ("#SBATCH -N 2\n", "srun python t.py\necho done\n", ["after its srun line", "move them"]),
    ("#SBATCH -N 2\n", "srun --label python t.py\n", ["--label", "drop --label"]),
    ("#SBATCH -N 2\n", "srun -N 4 python t.py\n", ["differs from the allocation", "#SBATCH --nodes=4"]),
    ("#SBATCH -N 2\n", "srun --weird value python t.py\n", ["--weird", "--weird=VALUE"]),
    ("#SBATCH -N 2\n", "time srun python t.py\n", ["not the line's command"]),
])  # fmt: skip
def test_what_cannot_be_adopted_is_one_line_with_a_fix(tmp_path, capsys, directives, body, words):
    path = _script(tmp_path, body, directives)
    assert main(["submit", "--script", str(path), "--campaign", str(tmp_path / "c"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fix:" in err, err
    for word in words:
        assert word in err, err


def test_quoted_shell_characters_are_plain_words_and_exec_srun_is_accepted(tmp_path):
    path = _script(tmp_path, "exec srun -n2 python -c 'import os; print(os.environ[\"RANK\"])' \"a;b\"\n",
                   "#SBATCH -N 2\n#SBATCH --ntasks=2\n")  # fmt: skip
    got = batchscript.parse(path.read_text())
    assert got.command == ("python", "-c", 'import os; print(os.environ["RANK"])', "a;b")
    assert got.srun_args == () and got.before == ()


def test_script_and_command_are_exclusive_and_an_unreadable_script_is_clear(tmp_path, capsys):
    assert main(["submit", "--script", "x.sbatch", "--", "python", "t.py"]) == 2
    assert "both --script" in capsys.readouterr().err
    assert main(["submit", "--script", str(tmp_path / "missing.sbatch"), "--campaign", str(tmp_path / "c")]) == 2
    assert "cannot read the batch script" in capsys.readouterr().err


def test_a_directive_after_the_first_command_is_not_a_directive():
    """sbatch stops reading #SBATCH at the first command: so does the adoption."""
    got = batchscript.parse("#!/bin/sh\n#SBATCH -N 1\nhostname\n#SBATCH --output=x\nsrun true\n")
    assert got.sbatch_flags == ("-N", "1") and got.before == ("hostname", "#SBATCH --output=x")


def test_parse_errors_are_usage_errors():
    with pytest.raises(UsageError):
        batchscript.parse("srun\n")


@pytest.mark.parametrize("odd", ["\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\r"])
def test_lines_end_where_bash_ends_them(odd: str) -> None:
    """Issue 22, low: parsing split lines like str.splitlines (at \\x0b, \\u2028, a lone \\r...), so the script the
    supervisor understood was not the one bash runs. Only \\n ends a line."""
    text = f"#!/bin/bash\n#SBATCH -N 2\necho set-up{odd}hostname\nsrun python train.py\n"
    got = batchscript.parse(text)
    assert got.command == ("python", "train.py") and got.srun_line == 4
    assert got.before == (f"echo set-up{odd}hostname",)  # one line, kept as bash reads it
    with pytest.raises(UsageError, match="srun is not the line's command"):  # srun hidden behind it: refused
        batchscript.parse(f"#!/bin/bash\necho x{odd}srun -n 9 evil\nsrun python train.py\n")


def test_dos_line_breaks_are_refused_with_the_fix() -> None:
    with pytest.raises(UsageError) as err:
        batchscript.parse("#!/bin/bash\r\n#SBATCH -N 2\r\nsrun python train.py\r\n", "job.sbatch")
    assert "DOS line breaks" in err.value.problem and "dos2unix job.sbatch" in err.value.fix

"""driver/torchrun_worker.py: a torchrun launch's worker command, read from the training command, and the
variables torchrun gives a worker (a warm restart starts a dead node's workers so, without torchrun)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from supervisor.driver.torchrun_worker import parse, worker_command, worker_identity


def test_the_script_and_its_arguments_follow_torchruns_options_in_both_spellings() -> None:
    w = parse(["torchrun", "--nnodes", "2", "--nproc-per-node=4", "--standalone", "train.py", "--lr", "3", "-m"], {})
    assert w is not None and w.nproc == 4 and w.argv == ("-u", "train.py", "--lr", "3", "-m") and w.launcher_at == 0
    w = parse(["/usr/bin/python3", "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "pkg.train", "x"], {})
    assert w is not None and w.nproc == 2 and w.argv == ("-u", "-m", "pkg.train", "x") and w.launcher_at == 2
    w = parse(["torchrun", "--no-python", "--rdzv_backend=static", "./run.sh", "a"], {"PET_NPROC_PER_NODE": "3"})
    assert w is not None and not w.python and w.argv == ("./run.sh", "a") and w.nproc == 3


def test_what_cannot_be_read_is_none_never_a_guess() -> None:
    assert parse(["python", "train.py"], {}) is None  # not torchrun
    assert parse(["torchrun", "--nproc-per-node=gpu", "t.py"], {}) is None  # counted by torchrun at its start
    assert parse(["torchrun", "--run-path", "t.py"], {}) is None  # runpy inside torchrun: no worker command
    assert parse(["torchrun", "--nproc", "2", "t.py"], {}) is None  # an abbreviation argparse would accept
    assert parse(["torchrun", "--nproc-per-node"], {}) is None  # a flag without its value
    assert parse(["torchrun", "--nnodes=2"], {}) is None  # no script
    assert parse(["sh", "-c", "torchrun t.py"], {}) is None  # a wrapper: the command inside is not ours to read


def test_the_workers_interpreter_is_torchruns_own(tmp_path: Path) -> None:
    script = tmp_path / "torchrun"
    script.write_text("#!/opt/venv/bin/python3.11\nimport sys\n")
    script.chmod(0o755)
    env = {"PATH": str(tmp_path)}
    assert worker_command(["torchrun", "--nproc-per-node=2", "t.py", "--x"], env) == \
        (["/opt/venv/bin/python3.11", "-u", "t.py", "--x"], 2)  # fmt: skip
    assert worker_command(["torchrun", "t.py"], {**env, "PYTHON_EXEC": "/usr/bin/python3"}) == \
        (["/usr/bin/python3", "-u", "t.py"], 1)  # fmt: skip
    assert worker_command(["/usr/bin/python3", "-m", "torch.distributed.run", "t.py"], {}) == \
        (["/usr/bin/python3", "-u", "t.py"], 1)  # fmt: skip
    script.write_text("#!/bin/sh\nexec something\n")  # not a Python: no worker command
    assert worker_command(["torchrun", "t.py"], env) is None
    assert worker_command(["torchrun", "t.py"], {"PATH": str(tmp_path / "nowhere")}) is None


def test_a_workers_identity_is_torchruns_for_its_group_and_rendezvous_through_rank_0() -> None:
    env = worker_identity(5, 8, 4, 2)
    assert env["RANK"] == "5" and env["LOCAL_RANK"] == "1" and env["GROUP_RANK"] == "1" and env["NODE_RANK"] == "1"
    assert env["WORLD_SIZE"] == "8" and env["LOCAL_WORLD_SIZE"] == "4" and env["GROUP_WORLD_SIZE"] == "2"
    assert env["TORCHELASTIC_USE_AGENT_STORE"] == "False"  # no torchrun hosts a store for it


@given(st.lists(st.text(max_size=12), max_size=12))
def test_any_command_parses_to_a_worker_or_none(words: list[str]) -> None:
    for command in (words, ["torchrun", *words]):
        w = parse(command, {})
        if w is not None:
            assert w.nproc >= 1 and w.argv and (not w.python or w.argv[0] == "-u")

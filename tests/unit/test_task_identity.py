"""A rank started again as its own one-task step (or taken over by a standby) sees Slurm's variables of its place in
the launch, not srun's "rank 0 of 1" (supervisor/driver/task_identity.py): what Lightning's SLURMEnvironment and
scripts reading SLURM_PROCID take their rank and world from."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.client.restart_order import ASSIGN_ENV, RestartOrder, encode_order, parse_order
from supervisor.decisions.placement import TrainingLayout
from supervisor.driver import task_identity
from supervisor.driver.context import Context
from supervisor.driver.launcher import Launch, TrainingLauncher

SHOW = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('SLURM_')}))"


def test_the_identity_is_srun_s_block_layout() -> None:
    got = task_identity.identity(5, 3, 2)
    assert got == {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "SLURM_NTASKS": "6",
                   "SLURM_NPROCS": "6", "SLURM_NNODES": "3", "SLURM_STEP_NUM_TASKS": "6", "SLURM_STEP_NUM_NODES": "3",
                   "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_STEP_TASKS_PER_NODE": "2(x3)",
                   "SLURM_NTASKS_PER_NODE": "2"}  # fmt: skip
    assert task_identity.identity(0, 1, 4)["SLURM_TASKS_PER_NODE"] == "4"
    for bad in ((6, 3, 2), (-1, 3, 2), (0, 0, 1), (0, 1, 0)):
        with pytest.raises(ValueError):
            task_identity.identity(*bad)


@given(st.integers(1, 64), st.integers(1, 8), st.data())
def test_every_rank_has_its_own_place_and_the_same_world(nodes: int, tasks: int, data: st.DataObject) -> None:
    rank = data.draw(st.integers(0, nodes * tasks - 1))
    got = task_identity.identity(rank, nodes, tasks)
    assert int(got["SLURM_NODEID"]) * tasks + int(got["SLURM_LOCALID"]) == rank == int(got["SLURM_PROCID"])
    assert int(got["SLURM_NTASKS"]) == nodes * tasks and int(got["SLURM_NNODES"]) == nodes


def test_the_program_sees_its_identity_over_what_srun_gave_the_one_task_step(tmp_path: Path) -> None:
    """slurmstepd sets SLURM_PROCID=0 and SLURM_NTASKS=1 after the environment srun passes: the carried values are
    exported over them by the fixed shell text, and the program's argv arrives verbatim (no shell text)."""
    odd = "$(touch pwned); `x` 'q' \"d\" ;|&"
    env = {"PATH": "/usr/bin:/bin", "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_NNODES": "1",
           **task_identity.carried(task_identity.identity(3, 2, 2))}  # fmt: skip
    argv = task_identity.as_task([sys.executable, "-c", SHOW + "; import sys; print(sys.argv[1])", odd])
    out = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True, check=True).stdout.splitlines()
    seen = json.loads(out[0])
    assert seen["SLURM_PROCID"] == "3" and seen["SLURM_NTASKS"] == "4" and seen["SLURM_NNODES"] == "2"
    assert seen["SLURM_LOCALID"] == "1" and seen["SLURM_NODEID"] == "1" and seen["SLURM_NTASKS_PER_NODE"] == "2"
    assert out[1] == odd and not (tmp_path / "pwned").exists()
    assert task_identity.carried({"PATH": "/evil", "SLURM_PROCID": "1"}) == {"SUPERVISOR_AS_SLURM_PROCID": "1"}


def test_a_standby_may_be_assigned_slurm_s_variables_and_nothing_else_of_slurm_s() -> None:
    assert set(task_identity.NAMES) <= ASSIGN_ENV, "the client's allowlist names every variable the launcher sends"
    order = RestartOrder(1, {"MASTER_PORT": "123", **task_identity.identity(1, 2, 1)})
    assert parse_order(encode_order(order, ASSIGN_ENV), ASSIGN_ENV).env["SLURM_PROCID"] == "1"
    with pytest.raises(ValueError):
        encode_order(RestartOrder(1, {"SLURM_JOB_ID": "9"}), ASSIGN_ENV)


def test_a_rank_started_again_or_assigned_to_a_standby_gets_its_place_in_the_launch(tmp_path: Path) -> None:
    started: list[tuple[list[str], dict[str, str]]] = []

    def start(argv, env, log_path, cwd):  # type: ignore[no-untyped-def]
        started.append((list(argv), dict(env)))
        return None

    launcher = TrainingLauncher(Context.of(lambda e: None), start=start, layout=TrainingLayout(("n1", "n2", "n3"), 2),
                                command=("python", "train.py"), cwd=None, srun_args=(), job_id="7", restart_count=0,
                                campaign=tmp_path, log_dir=tmp_path, node_addresses={}, checkpoint_dir_known=True,
                                environ={})  # type: ignore[arg-type]  # fmt: skip
    launch = Launch(1, "train-1", None, tmp_path / "l.log", 0.0, ("n1", "n2", "n3"))  # type: ignore[arg-type]
    order = RestartOrder(1, {"MASTER_PORT": "20000"})
    launcher.start_again(launch, order, {3: "n2"})
    argv, env = started[0]
    assert argv[argv.index("--mem=0") + 1:][:2] == ["/bin/sh", "-c"] and argv[-2:] == ["python", "train.py"]
    assert env["SUPERVISOR_AS_SLURM_PROCID"] == "3" and env["SUPERVISOR_AS_SLURM_NTASKS"] == "6"
    assert env["RANK"] == "3" and env["MASTER_PORT"] == "20000"
    assigned = launcher.assignment(launch, order, 4)
    assert assigned.env["SLURM_PROCID"] == "4" and assigned.env["SLURM_NODEID"] == "2" and assigned.env["RANK"] == "4"

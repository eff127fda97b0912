"""SlurmEnv: typed view of SLURM_* variables, from real captured batch-step environments."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm.env import SlurmEnv, is_srun_step, parse_tasks_per_node
from slurm.errors import SlurmConfigError, SlurmEnvError
from supervisor.errors import exit_code_of

FIXTURES = Path(__file__).parent / "fixtures" / "slurm" / "22.05"


def _env_file(name: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (FIXTURES / name).read_text().splitlines() if "=" in line)
    return dict(pairs)


def test_batch_step_of_a_first_run() -> None:
    env = SlurmEnv.from_environ(_env_file("env_batch_step.txt"))
    assert env.in_allocation and env.in_batch_step
    assert env.job_id == "1"
    assert env.restart_count == 0  # Slurm does not set SLURM_RESTART_COUNT before the first requeue
    assert env.nodelist == ("node1", "node2")
    assert env.nnodes == 2 and env.ntasks == 4
    assert env.tasks_per_node == (2, 2)
    assert env.batch_host == "node1"
    assert env.step_id is None
    assert env.end_time is None  # 22.05 has no SLURM_JOB_END_TIME
    assert env.cluster_name == "localcluster"
    assert env.partition == "batch"
    assert env.job_name == "engA-capture"


def test_the_batch_script_of_slurm_26_05_is_the_batch_step_though_it_has_a_step_id() -> None:
    """26.05 exports SLURM_STEP_ID=-5 (SLURM_BATCH_SCRIPT) in the batch script: read as a task's step, the
    supervisor found no batch host (no bind address: every run crashed) and the agents took it for rank 0."""
    env = SlurmEnv.from_environ(_env_file("../26.05/env_batch_step.txt"))
    assert env.step_id == "-5" and env.procid == 0
    assert env.in_batch_step and env.batch_host == "node2"
    assert env.nodelist == ("node2", "node3") and env.tasks_per_node == (2, 2) and env.end_time == 1828125779
    assert not is_srun_step(env.step_id) and not is_srun_step("4294967291") and not is_srun_step("-4")
    assert is_srun_step("0") and is_srun_step("12") and not is_srun_step(None) and not is_srun_step("²")


def test_batch_step_after_a_requeue() -> None:
    env = SlurmEnv.from_environ(_env_file("env_batch_step_restart1.txt"))
    assert env.restart_count == 1
    assert env.nodelist == ("node2", "node3")
    assert env.batch_host == "node2"


def test_task_in_an_srun_step() -> None:
    env = SlurmEnv.from_environ(
        {
            "SLURM_JOB_ID": "77",
            "SLURM_STEP_ID": "0",
            "SLURMD_NODENAME": "node3",
            "SLURM_PROCID": "3",
            "SLURM_LOCALID": "1",
            "SLURM_NODEID": "1",
            "SLURM_JOB_NODELIST": "node[2-3]",
            "SLURM_JOB_END_TIME": "1796209226",
            "SLURM_RESTART_COUNT": "2",
        }
    )
    assert not env.in_batch_step
    assert env.batch_host is None  # a task cannot know the batch host from its environment
    assert (env.procid, env.localid, env.nodeid) == (3, 1, 1)
    assert env.node_name == "node3"
    assert env.end_time == 1796209226
    assert env.restart_count == 2


def test_outside_slurm() -> None:
    env = SlurmEnv.from_environ({"HOME": "/root"})
    assert not env.in_allocation
    assert env == SlurmEnv()
    assert env.world_size is None


def test_old_aliases_are_understood() -> None:
    env = SlurmEnv.from_environ({"SLURM_JOBID": "5", "SLURM_NODELIST": "n[1-2]", "SLURM_NPROCS": "8"})
    assert env.job_id == "5" and env.nodelist == ("n1", "n2") and env.ntasks == 8


def test_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "99")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "4")
    env = SlurmEnv.from_environ()
    assert env.job_id == "99" and env.restart_count == 4


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("SLURM_RESTART_COUNT", "one"),
        ("SLURM_RESTART_COUNT", "-1"),
        ("SLURM_JOB_ID", "12; rm -rf /"),
        ("SLURM_JOB_NODELIST", "node[1-[2]]"),
        ("SLURMD_NODENAME", "--help"),
        ("SLURM_NNODES", "0"),
        ("SLURM_TASKS_PER_NODE", "2(x"),
    ],
)
def test_bad_values_name_the_variable(var: str, value: str) -> None:
    with pytest.raises(SlurmEnvError) as info:
        SlurmEnv.from_environ({"SLURM_JOB_ID": "1", var: value})
    assert var in info.value.problem
    assert isinstance(info.value, SlurmConfigError) and exit_code_of(info.value) == 3


def test_tasks_per_node_format() -> None:
    assert parse_tasks_per_node("2(x3),1") == (2, 2, 2, 1)
    assert parse_tasks_per_node("4") == (4,)
    assert SlurmEnv.from_environ({"SLURM_TASKS_PER_NODE": "2(x2),1"}).world_size == 5


def test_env_is_frozen() -> None:
    env = SlurmEnv.from_environ({"SLURM_JOB_ID": "1"})
    with pytest.raises(AttributeError):
        env.job_id = "2"  # type: ignore[misc]

"""The srun lines of the four job steps the supervisor runs (slurm/srun.py): their shape is what Slurm needs."""

from __future__ import annotations

from slurm import srun


def test_the_agents_run_one_task_per_node_and_survive_a_lost_node() -> None:
    argv = srun.agents(("node1", "node2", "node3"), ["python3", "-m", "supervisor.agent", "--campaign", "/c"])
    assert argv[:2] == ["srun", "--overlap"]
    for flag in ("--nodelist=node[1-3]", "--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--no-kill",
                 "--kill-on-bad-exit=0", "--mem=0", f"--job-name={srun.AGENTS_JOB_NAME}"):  # fmt: skip
        assert flag in argv, flag
    assert argv[-5:] == ["python3", "-m", "supervisor.agent", "--campaign", "/c"]


def test_a_training_launch_is_labelled_named_and_killed_on_a_bad_exit() -> None:
    argv = srun.training(["python", "t.py"], launch=3, nodes=2, tasks_per_node=4, exclude=("node9", "node8"),
                         nodelist=("node1", "node2"), extra=("--cpu-bind=none",))  # fmt: skip
    assert argv[:3] == ["srun", "--overlap", "--job-name=train-3"] and srun.training_job_name(3) == "train-3"
    for flag in ("--nodes=2", "--ntasks-per-node=4", "--ntasks=8", "--kill-on-bad-exit=1", "--label",
                 "--nodelist=node[1-2]", "--exclude=node[8-9]"):  # fmt: skip
        assert flag in argv, flag
    assert argv[-3:] == ["--cpu-bind=none", "python", "t.py"]  # the user's srun options before the command
    assert "--distribution=arbitrary" not in argv


def test_a_warm_launch_survives_one_tasks_death_and_its_replacement_is_one_named_task_beside_it() -> None:
    argv = srun.training(["python", "t.py"], launch=3, nodes=2, tasks_per_node=1, warm=True)
    assert "--kill-on-bad-exit=0" in argv and "--kill-on-bad-exit=1" not in argv
    rep = srun.replacement(["python", "t.py"], launch=3, generation=2, rank=5, node="node4", extra=("--cpu-bind=none",))
    assert rep[:3] == ["srun", "--overlap", "--job-name=train-3-g2-r5"]
    assert srun.replacement_job_name(3, 2, 5) == "train-3-g2-r5"
    for flag in ("--nodes=1", "--ntasks=1", "--nodelist=node4", "--kill-on-bad-exit=1", "--mem=0"):
        assert flag in rep, flag
    assert rep[-3:] == ["--cpu-bind=none", "python", "t.py"]


def test_moved_ranks_are_placed_by_the_hostfile_without_a_node_count() -> None:
    argv = srun.training(["python", "t.py"], launch=2, nodes=2, tasks_per_node=2, arbitrary=True)
    assert "--distribution=arbitrary" in argv and argv[-2:] == ["python", "t.py"]
    # Slurm 24.11's srun: "--nodes is incompatible with --distribution=arbitrary"; the hostfile places the tasks
    assert not any(a.startswith(("--nodes=", "--ntasks-per-node=")) for a in argv)
    assert "--ntasks=4" in argv
    assert srun.hostfile_text(("node2", "node1"), 2) == "node2\nnode2\nnode1\nnode1\n"


def test_the_preflight_is_one_task_per_node_with_a_step_time_limit() -> None:
    argv = srun.preflight(["node1", "node2"], ["python3", "-m", "w"], minutes=2, extra=["--mem=0"])
    assert argv[:3] == ["srun", "--overlap", f"--job-name={srun.PREFLIGHT_JOB_NAME}"]
    for flag in ("--nodelist=node[1-2]", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--time=2", "--mem=0"):
        assert flag in argv, flag
    assert argv[-3:] == ["python3", "-m", "w"]


def test_the_probe_is_a_short_overlapping_step_on_the_one_node() -> None:
    argv = srun.probe("node2", "42")
    assert argv[:3] == ["srun", "--overlap", "--jobid=42"] and "--nodelist=node2" in argv and argv[-1] == "true"
    assert "--nodes=1" in argv and "--ntasks=1" in argv and "--mem=0" in argv
    assert "--jobid=42" not in srun.probe("node2") and srun.probe("n", srun="/x/srun")[0] == "/x/srun"

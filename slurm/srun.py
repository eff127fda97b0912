"""Every ``srun`` command line the supervisor runs, built in one place.

Four job steps run inside a supervised allocation: the node agents (one task per node, for the whole Slurm run),
each launch of the training, the preflight measurement before a launch, and the one-task probe that asks whether
a node is still there. Their shapes differ for reasons learned on real Slurm (see each function); keeping them
together keeps those reasons next to each other, and the Slurm-version differences in one module.

Pure: argument lists only (never shell text); what runs inside the step (``command``) is the caller's.
"""

from __future__ import annotations

from collections.abc import Sequence

from slurm.hostlist import compress

AGENTS_JOB_NAME = "supervisor-agent"
PREFLIGHT_JOB_NAME = "preflight"
PROBE_JOB_NAME = "supervisor-probe"


def training_job_name(launch: int) -> str:
    """The training step's name (``train-<launch>``): the supervisor finds its step id by it to kill it."""
    return f"train-{launch}"


def agents(nodes: Sequence[str], command: Sequence[str]) -> list[str]:
    """The node agents: one task on each node, sharing CPUs with the training (``--overlap``, one CPU, no
    memory claim), and surviving the loss of a node (``--no-kill``, ``--kill-on-bad-exit=0``) so the other
    nodes stay watched."""
    n = len(nodes)
    return [
        "srun", "--overlap", f"--nodelist={compress(list(nodes))}", f"--nodes={n}", f"--ntasks={n}",
        "--ntasks-per-node=1", f"--job-name={AGENTS_JOB_NAME}", "--kill-on-bad-exit=0", "--no-kill",
        "--cpus-per-task=1", "--mem=0", "--quiet", *command,
    ]  # fmt: skip


def training(
    command: Sequence[str], *, launch: int, nodes: int, tasks_per_node: int, exclude: Sequence[str] = (),
    nodelist: Sequence[str] = (), arbitrary: bool = False, extra: Sequence[str] = (), warm: bool = False,
) -> list[str]:  # fmt: skip
    """One launch of the training on ``nodes`` nodes, ``exclude`` left out. With ``nodelist`` the step runs on
    exactly those nodes; ``arbitrary``: tasks go where SLURM_HOSTFILE says, in its order (ranks moved to other
    nodes, see :func:`hostfile_text`). ``extra``: the user's own srun options (``[run] srun_args``). ``warm``: the
    ranks restart in their processes (``client.restartable``), so one task's death must not end the step
    (``--kill-on-bad-exit=0``), nor one node's (``--no-kill``: the step goes on without the node's tasks, measured
    on 22.05: srun says "Node failure on NODE" and ends with the other tasks; the job itself survives the node only
    when submitted with ``--no-kill``, as with spare nodes). The supervisor ends the step itself when it restarts
    cold."""
    # With an arbitrary distribution the hostfile places every task; Slurm 24.11's srun refuses --nodes beside it
    # ("--nodes is incompatible with --distribution=arbitrary"), 22.05 accepted it.
    shape = [] if arbitrary else [f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}"]
    argv = [
        # --overlap: after a node failure Slurm may keep the dead step's CPUs on the survivors booked until the
        # lost node is cleaned up; the relaunch must not wait for that ("Requested nodes are busy").
        "srun", "--overlap", f"--job-name={training_job_name(launch)}", *shape, f"--ntasks={nodes * tasks_per_node}",
        f"--kill-on-bad-exit={0 if warm else 1}", *(["--no-kill"] if warm else []), "--mem=0",
        "--label",  # "N: " before each line: log lines name their rank and node (decisions/tasklog.py)
    ]  # fmt: skip
    if nodelist:
        argv.append(f"--nodelist={compress(list(nodelist))}")
    if exclude:
        argv.append(f"--exclude={compress(sorted(set(exclude)))}")
    if arbitrary:
        argv.append("--distribution=arbitrary")
    return [*argv, *extra, *command]


def replacement_job_name(launch: int, generation: int, rank: int) -> str:
    """A rank started again by a warm restart: its own one-task step (``train-<launch>-g<generation>-r<rank>``)."""
    return f"{training_job_name(launch)}-g{generation}-r{rank}"


def replacement(command: Sequence[str], *, launch: int, generation: int, rank: int, node: str,
                extra: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """One rank of a launch started again on ``node`` in the launch's allocation, beside the training step whose
    other ranks kept their processes (``--overlap``: the step still holds the CPUs of the rank that died). One task;
    its rank comes from the environment the supervisor sets, not from srun's task id (always 0 here)."""
    return [
        "srun", "--overlap", f"--job-name={replacement_job_name(launch, generation, rank)}", "--nodes=1",
        "--ntasks=1", f"--nodelist={node}", "--kill-on-bad-exit=1", "--mem=0", *extra, *command,
    ]  # fmt: skip


def standby_job_name(launch: int, standby: str) -> str:
    """A standby rank of launch ``launch`` (``train-<launch>-standby-<id>``): cancelled by name when idle at the
    launch's end; once it takes over a rank it is one of the launch's steps."""
    return f"{training_job_name(launch)}-standby-{standby}"


def standby(command: Sequence[str], *, launch: int, standby: str, node: str, extra: Sequence[str] = ()) -> list[str]:
    """A standby process on ``node``, beside the training step (``--overlap``: it claims no CPU of the ranks;
    one task, no memory claim). ``command``: the standby's own command line (``python -m supervisor.client.standby
    -- SCRIPT ARGS``), which becomes a rank when assigned: the step then ends with the rank."""
    return [
        "srun", "--overlap", f"--job-name={standby_job_name(launch, standby)}", "--nodes=1", "--ntasks=1",
        f"--nodelist={node}", "--kill-on-bad-exit=1", "--mem=0", *extra, *command,
    ]  # fmt: skip


def hostfile_text(nodes: Sequence[str], tasks_per_node: int) -> str:
    """SLURM_HOSTFILE for ``--distribution=arbitrary``: one line per task, in rank order."""
    return "".join(f"{n}\n" for n in nodes for _ in range(tasks_per_node))


def preflight(nodes: Sequence[str], command: Sequence[str], *, minutes: int, extra: Sequence[str] = ()) -> list[str]:
    """The preflight measurement: one task per node, overlapping the agents' step, with a step time limit
    (``--time``, whole minutes) so a stuck measurement cannot outlive its budget."""
    return [
        "srun", "--overlap", f"--job-name={PREFLIGHT_JOB_NAME}", f"--nodelist={compress(list(nodes))}",
        f"--nodes={len(nodes)}", f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--time={minutes}",
        "--kill-on-bad-exit=1", *extra, *command,
    ]  # fmt: skip


def probe(node: str, job_id: str | None = None, srun: str = "srun") -> list[str]:
    """One probe of ``node`` (inside job ``job_id``, default: the caller's $SLURM_JOB_ID): ``true`` as a one-task
    overlapping step; it answers within ~0.1 s on a live node."""
    argv = [srun, "--overlap"]
    if job_id:
        argv.append(f"--jobid={job_id}")
    return [
        *argv, f"--nodelist={node}", "--nodes=1", "--ntasks=1", "--ntasks-per-node=1", "--cpus-per-task=1",
        "--mem=0", "--quiet", f"--job-name={PROBE_JOB_NAME}", "--kill-on-bad-exit=1", "true",
    ]  # fmt: skip

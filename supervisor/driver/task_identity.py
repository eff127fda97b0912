"""A rank's place in its launch's job step, as Slurm describes it, for a rank that runs outside that step.

WHY: a warm restart starts a dead rank again as the only task of its own one-task step, and a standby runs as one;
srun (slurmstepd) gives such a process ``SLURM_PROCID=0``, ``SLURM_NTASKS=1``, ``SLURM_NNODES=1``. The supervisor
sets ``RANK``/``LOCAL_RANK``/``WORLD_SIZE`` for it, but programs that read their place from Slurm see a world of
one: PyTorch Lightning's ``SLURMEnvironment`` takes its global rank from ``SLURM_PROCID`` and its world size from
``SLURM_NTASKS`` (and checks ``SLURM_NNODES``/``SLURM_NTASKS_PER_NODE`` against the Trainer's), and many scripts
do ``int(os.environ["SLURM_PROCID"])``. Such a rank would start a training of its own instead of rejoining.

So the rank gets the values the launch's own srun gave it. srun sets these names itself over the environment it
is given (measured on 22.05: ``SLURM_PROCID=7 SLURM_NTASKS=9 srun -n1 env`` prints 0 and 1), so they travel under ``SUPERVISOR_AS_<NAME>`` and a fixed shell text exports them over
Slurm's before ``exec`` of the program (``as_task``: the user's argv stays separate argv entries, never shell text,
and the ``exec`` keeps the pid the agents see). A standby applies them in its own process (``identity``). Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

# What srun sets per task and per step that tells a process its place (srun(1), "OUTPUT ENVIRONMENT VARIABLES").
NAMES = (
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NNODES",
    "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES", "SLURM_TASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE",
    "SLURM_NTASKS_PER_NODE",
)  # fmt: skip
CARRIER = "SUPERVISOR_AS_"  # the prefix the values travel under to the one-task step (slurmstepd keeps them)


def identity(rank: int, nodes: int, tasks_per_node: int) -> dict[str, str]:
    """Slurm's variables for task ``rank`` of a step of ``nodes`` nodes with ``tasks_per_node`` tasks each, in
    srun's block layout (rank ``r`` on the ``r // tasks_per_node``-th node)."""
    if nodes < 1 or tasks_per_node < 1 or not 0 <= rank < nodes * tasks_per_node:
        raise ValueError(f"rank {rank} is not a task of {nodes} node(s) x {tasks_per_node}")
    world = nodes * tasks_per_node
    per_node = f"{tasks_per_node}(x{nodes})" if nodes > 1 else str(tasks_per_node)
    values = (rank, rank % tasks_per_node, rank // tasks_per_node, world, world, nodes, world, nodes, per_node,
              per_node, tasks_per_node)  # fmt: skip
    return {name: str(value) for name, value in zip(NAMES, values, strict=True)}


def carried(values: dict[str, str]) -> dict[str, str]:
    """``values`` under the names that reach the one-task step's process unchanged."""
    return {CARRIER + name: value for name, value in values.items() if name in NAMES}


def as_task(command: Sequence[str]) -> list[str]:
    """``command`` run by ``/bin/sh -c`` after exporting every ``NAMES`` variable from its carrier (set by
    :func:`carried` in srun's environment); the shell text is built from the constant table only."""
    exports = " ".join(f'{name}="${{{CARRIER}{name}}}"' for name in NAMES)
    return ["/bin/sh", "-c", f'export {exports}; exec "$@"', "sh", *command]

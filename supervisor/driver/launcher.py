"""Start and stop the training's launches: one srun of the training per launch, relaunched in the same allocation
after a crash or hang.

:class:`TrainingLauncher` starts each launch: its number in the attempt, its nodes in rank order
(``decisions.placement``), the env:// variables of the launch (``distenv``: a fresh MASTER_PORT each time), the
supervision variables every step of the attempt gets (the campaign, the slot directory, where to resume), the
srun line (``slurm.srun``) and the launch's log; each launch is journaled (``step_launched``) before it starts.
Steps are named (``train-<n>``) so the supervisor can find a step's id and kill it on every node at once with
scancel (:func:`kill_step`), even when ranks are stopped. All commands are argument lists.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from slurm import srun
from slurm.client import SlurmClient
from slurm.errors import SlurmError
from supervisor.agent.discover import HELPER_ENV
from supervisor.checkpoint import memory
from supervisor.client.restart_order import ENV_GENERATION, ENV_WARM, RestartOrder
from supervisor.client.rollback import ENV_SKIP_STEPS
from supervisor.client.standby import ENV_STANDBY as STANDBY_ENV
from supervisor.decisions import events as ev
from supervisor.decisions import placement
from supervisor.decisions.log_signatures import DEFAULT_LOG_SIGNATURES, LogSignature
from supervisor.driver import distenv, flight_dumps, task_identity, torchrun_worker
from supervisor.driver.context import Context
from supervisor.driver.launch_log import LaunchLog
from supervisor.driver.ports import Process, StepLauncher
from supervisor.paths import SLOT_DIR_ENV, slot_dir_template

RESUME_ENV = "SUPERVISOR_RESUME_FROM"
TORCHRUN_RANKS_PER_TASK = 8  # under ``srun torchrun`` a task is a node's torchrun: its ranks' lines interleave


@dataclasses.dataclass(frozen=True)
class Replacement:
    """A rank a warm restart started again: its own one-task job step."""

    rank: int
    node: str
    generation: int
    name: str
    proc: Process
    log_path: Path
    started_at: float = dataclasses.field(default_factory=time.monotonic)  # its step's start, or its assignment


class LaunchProcs:
    """The launch's sruns seen as one process (``Launch.proc`` after a warm restart): running while any runs; its
    code is the worst of theirs (the watch judges the launch's end from its ranks: ``Watcher.generation_code``);
    kill and terminate reach every one."""

    def __init__(self, procs: Sequence[Process]) -> None:
        self.procs = list(procs)
        self.returncode: int | None = None

    def add(self, proc: Process) -> None:
        self.procs.append(proc)
        self.returncode = None

    def poll(self) -> int | None:
        codes = [p.poll() for p in self.procs]
        if any(c is None for c in codes):
            return None
        self.returncode = next((c for c in codes if c), 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for p in self.procs:
            p.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        code = self.poll()
        assert code is not None
        return code

    def terminate(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()

    def kill(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()


@dataclasses.dataclass(frozen=True)
class Standby:
    """A standby process beside a launch (``client/standby.py``): its own one-task step, idle until it takes over
    a rank."""

    ident: str
    node: str
    name: str
    proc: Process
    log_path: Path

    def as_rank(self, rank: int, generation: int) -> Replacement:
        """The standby once it took over ``rank``: one of the launch's steps from then on."""
        return Replacement(rank, self.node, generation, self.name, self.proc, self.log_path)


@dataclasses.dataclass
class Launch:
    """One launch of the training (one srun, a Slurm job step): its number in this attempt (1, 2, ...), the job
    step's name, the srun process, its log and nodes."""

    number: int
    name: str
    proc: Process
    log_path: Path
    started: float
    nodes: tuple[str, ...]
    worker_restarts: bool = False  # torchrun may restart its workers inside the launch (--max-restarts > 0)
    log: LaunchLog | None = None  # the log read as it grows (one reading the whole log when not given)
    warm: bool = False  # its ranks restart in their processes (the step survives one task's death)
    generation: int = 0  # warm restarts so far
    replaced: list[Replacement] = dataclasses.field(default_factory=list)  # ranks started again, newest last
    startup_s: float | None = None  # from its srun to its first step (a warm launch's watch measures it)

    def __post_init__(self) -> None:
        if self.log is None:
            self.log = LaunchLog(self.log_path)

    @property
    def names(self) -> tuple[str, ...]:
        """Every job step of the launch: the training step and the ranks started again by warm restarts."""
        return (self.name, *(r.name for r in self.replaced))

    @property
    def reader(self) -> LaunchLog:
        assert self.log is not None  # (set in __post_init__)
        return self.log


def resume_value(resume: str | None, checkpoint_dir_known: bool, scan_ok: bool) -> str | None:
    """What a launch tells the program about where to resume (``SUPERVISOR_RESUME_FROM``): the validated checkpoint's
    path, "" for a fresh start (there is none), or None, unset, when it is unknown (no checkpoint directory named,
    or the last scan failed): the program then looks itself."""
    if resume is None and (not checkpoint_dir_known or not scan_ok):
        return None
    return resume or ""


class TrainingLauncher:
    def __init__(
        self, ctx: Context, *, start: StepLauncher, layout: placement.TrainingLayout, command: Sequence[str], cwd: str | None,
        srun_args: Sequence[str], job_id: str, restart_count: int, campaign: Path, log_dir: Path,
        node_addresses: Mapping[str, str], checkpoint_dir_known: bool | Callable[[], bool],
        environ: Mapping[str, str] = os.environ,
        signatures: Sequence[LogSignature] = DEFAULT_LOG_SIGNATURES, memory_snapshots: str | int = "off",
    ) -> None:  # fmt: skip
        """``memory_snapshots``: ``[run] memory_snapshots`` ("auto", "off" or every N steps): where the ranks'
        memory store is, and how often they snapshot, go into every step's environment unless it is "off"."""
        self.ctx, self.start, self.layout, self.command, self.cwd = ctx, start, layout, tuple(command), cwd
        self.srun_args, self.job_id, self.restart_count = tuple(srun_args), job_id, restart_count
        self.campaign, self.log_dir, self.node_addresses = campaign, log_dir, node_addresses
        self.checkpoint_dir_known, self.environ = checkpoint_dir_known, environ
        self.signatures = tuple(signatures)  # the campaign's, for the launch log's digest
        self.launches = 0
        self.master_ports: list[int] = []  # each launch's MASTER_PORT: a relaunch never reuses one
        self.slot_token = secrets.token_hex(8)  # this Slurm run's slot directories get unguessable names
        self.memory_snapshots = memory_snapshots
        # under ``srun torchrun``: how to start one of its workers without it, and its workers per node (None:
        # not torchrun, or one whose workers cannot be read from the command: its restarts are cold)
        self.torchrun_worker = torchrun_worker.worker_command(command, environ) if distenv.runs_torchrun(command) \
            else None  # fmt: skip

    @property
    def ranks_per_node(self) -> int:
        """Ranks on each node of a launch: srun's tasks, or each node's torchrun's workers."""
        return self.torchrun_worker[1] if self.torchrun_worker is not None else self.layout.tasks_per_node

    @property
    def known_ranks_per_node(self) -> int | None:
        """:attr:`ranks_per_node` where it is known: None under a torchrun whose workers per node its options do not
        say (srun's one task per node there is a torchrun, not a rank: a world size from it would be wrong)."""
        if distenv.runs_torchrun(self.command):
            worker = torchrun_worker.parse(self.command, self.environ)
            return worker.nproc if worker is not None else None
        return self.layout.tasks_per_node

    def step_env(self, resume: str | None = "") -> dict[str, str]:
        """The environment of a job step of this attempt (agents, preflight, training): the user's, the campaign,
        the slot directory template; ``resume``: ``SUPERVISOR_RESUME_FROM`` (None: unset, see :func:`resume_value`)."""
        env = dict(self.environ)
        env["SUPERVISOR_CAMPAIGN"] = str(self.campaign)
        env[SLOT_DIR_ENV] = slot_dir_template(self.job_id, self.slot_token)
        for name in (memory.MEMORY_DIR_ENV, memory.EVERY_ENV, memory.RESUME_STEP_ENV, memory.RESUME_LAUNCH_ENV,
                     memory.RESUME_FLUSHED_ENV, memory.LAUNCH_ENV, ENV_SKIP_STEPS, ENV_WARM, ENV_GENERATION):  # fmt: skip
            env.pop(name, None)  # ours to set, never inherited from the batch script's environment
        if self.memory_snapshots != "off":  # the store lives in the agent's slot directory: it outlives the ranks
            env[memory.MEMORY_DIR_ENV] = f"{env[SLOT_DIR_ENV]}/memory"
            env[memory.EVERY_ENV] = str(self.memory_snapshots)
        if resume is None:
            env.pop(RESUME_ENV, None)
        else:
            env[RESUME_ENV] = resume
        return env

    def next_nodes(self, excluded: Sequence[str], rank_shift: int) -> tuple[str, ...]:
        """The nodes of the next launch in rank order (what :meth:`launch` will use)."""
        return placement.step_nodes(self.layout, excluded, rank_shift)

    def launch_tag(self, number: int) -> str:
        """Launch ``number``'s name for its ranks (``SUPERVISOR_LAUNCH``): unique in the campaign."""
        return f"{self.job_id or 'job'}-{self.restart_count}-{number}"

    def launch(self, resume: str | None, resume_step: int | None, excluded: Sequence[str], rank_shift: int,
               scan_ok: bool = True, memory_step: int | None = None, memory_launch: str = "",
               memory_from: str = "", skip_steps: tuple[int, int] | None = None, warm: bool = False) -> Launch:  # fmt: skip
        """The next launch (journaled as ``step_launched``, the contract's name), on the usable nodes without
        ``excluded``, its ranks moved by ``rank_shift`` nodes; ``memory_step``: the memory snapshot it resumes
        from (``resume`` stays the filesystem tier's checkpoint, which the ranks fall back on); ``memory_from``: the
        directory of that snapshot flushed to the filesystem, when some rank reads its shard there; ``skip_steps``:
        after a roll back, the steps whose batches the program skips (``client.skip_steps()``); ``warm``: its ranks
        restart in their processes (``client.restartable``): the step survives one task's death and the ranks wait
        for the supervisor's restart order (:meth:`start_again`)."""
        self.launches += 1
        number, name = self.launches, srun.training_job_name(self.launches)
        nodes = self.next_nodes(excluded, rank_shift)
        moved = placement.moved(self.layout, nodes)
        dist = self._dist_env(nodes, moved)  # MASTER_ADDR: rank 0's node, moved or not
        argv = srun.training(dist.wrap(self.command), launch=number, nodes=len(nodes),
                             tasks_per_node=self.layout.tasks_per_node, exclude=excluded,
                             nodelist=() if moved else nodes, arbitrary=moved, extra=self.srun_args,
                             warm=warm)  # fmt: skip
        log_path = self.log_dir / f"{name}.log"
        dumps = flight_dumps.dump_dir(log_path)  # the ranks' flight recorders dump here on a collective timeout
        dumps.mkdir(mode=0o700, parents=True, exist_ok=True)
        known = self.checkpoint_dir_known() if callable(self.checkpoint_dir_known) else self.checkpoint_dir_known
        told = resume_value(resume, known, scan_ok)
        env = {**self.step_env(told), **dist.env,
               **distenv.flight_recorder_env(str(dumps / flight_dumps.PREFIX), self.environ)}  # fmt: skip
        env[memory.LAUNCH_ENV] = self.launch_tag(number)
        if memory_step is not None:
            env[memory.RESUME_STEP_ENV] = str(memory_step)
            env[memory.RESUME_LAUNCH_ENV] = memory_launch
            if memory_from:
                env[memory.RESUME_FLUSHED_ENV] = memory_from
        if skip_steps is not None:
            env[ENV_SKIP_STEPS] = f"{skip_steps[0]}-{skip_steps[1]}"
        if warm:
            env[ENV_WARM] = "1"
        if moved:  # rank 0 is no longer on the first node of the step's node list: say where it is
            hosts = self.log_dir / f"{name}.hosts"
            hosts.write_text(srun.hostfile_text(nodes, self.layout.tasks_per_node))
            env["SLURM_HOSTFILE"] = str(hosts)
        # where the ranks resume: memory, the filesystem checkpoint, a fresh start, or unknown (they look themselves)
        tier = "memory" if memory_step is not None else "filesystem" if told else "fresh" if told == "" else "unknown"
        launched = {**ev.step_launched(self.ctx.clock(), number, nodes, excluded, resume),
                    "resume_step": memory_step if memory_step is not None else resume_step, "resume_tier": tier,
                    "master": f"{dist.env.get('MASTER_ADDR', '')}:{dist.env.get('MASTER_PORT', '')}"}
        if moved:
            launched["rank_nodes"] = list(nodes)
        if skip_steps is not None:
            launched["skip_steps"] = list(skip_steps)
        if warm:
            launched["warm"] = True
        self.ctx.record(launched)
        proc = self.start(argv, env, log_path, self.cwd)
        torchrun = distenv.runs_torchrun(self.command)
        log = LaunchLog(log_path, tasks=len(nodes) * self.layout.tasks_per_node, signatures=self.signatures,
                        ranks_per_task=TORCHRUN_RANKS_PER_TASK if torchrun else 1,
                        markers=not distenv.plain_python(self.command))  # fmt: skip
        return Launch(number, name, proc, log_path, time.monotonic(), nodes,
                      worker_restarts=distenv.torchrun_restarts_on(self.command, self.environ), log=log, warm=warm)

    def restart_order(self, launch: Launch, generation: int, resume: str | None, scan_ok: bool,
                      memory_step: int | None, memory_launch: str, memory_from: str,
                      rank0_node: str | None = None) -> RestartOrder:  # fmt: skip
        """The order of ``launch``'s warm restart into ``generation``: a fresh rendezvous port (on rank 0's node,
        as every launch; ``rank0_node``: where rank 0 runs, which torchrun's rendezvous chose), where to resume (as
        :meth:`launch` says it), and the launch tag of ``launch``'s number, which the caller made the next launch's
        (the memory tier tells a step written again after the restart from the one written before)."""
        master = self.environ.get("MASTER_ADDR") or self.node_addresses.get(launch.nodes[0]) or launch.nodes[0]
        if self.torchrun_worker is not None:  # rank 0 is where torchrun's rendezvous put it, not the first node
            master = self.node_addresses.get(rank0_node or launch.nodes[0]) or rank0_node or launch.nodes[0]
        user_port = self.environ.get("MASTER_PORT", "")
        port = int(user_port) if user_port.isdigit() else distenv.pick_port(master, self.master_ports)
        self.master_ports.append(port)
        known = self.checkpoint_dir_known() if callable(self.checkpoint_dir_known) else self.checkpoint_dir_known
        env: dict[str, str | None] = {
            "MASTER_ADDR": master, "MASTER_PORT": str(port), RESUME_ENV: resume_value(resume, known, scan_ok),
            memory.RESUME_STEP_ENV: None if memory_step is None else str(memory_step),
            memory.RESUME_LAUNCH_ENV: memory_launch or None if memory_step is not None else None,
            memory.RESUME_FLUSHED_ENV: memory_from or None if memory_step is not None else None,
            memory.LAUNCH_ENV: self.launch_tag(launch.number), ENV_SKIP_STEPS: None,
        }  # fmt: skip
        if self.torchrun_worker is not None:  # rank 0 hosts the new rendezvous's store, not a torchrun
            env["TORCHELASTIC_USE_AGENT_STORE"] = "False"
        return RestartOrder(generation, env)

    def start_again(self, launch: Launch, order: RestartOrder, ranks: Mapping[int, str]) -> list[Replacement]:
        """Start each of ``ranks`` (rank -> node) again as its own one-task step beside ``launch``'s, in the order's
        generation, with the identity the launch gave that rank and the order's rendezvous and resume point."""
        started = []
        for rank, node in sorted(ranks.items()):
            name = srun.replacement_job_name(launch.number, order.generation, rank)
            env = self.rank_step_env(launch)
            order.apply(env)
            env.update(self.rank_identity(launch, rank))
            if self.torchrun_worker is not None:  # (under torchrun, SLURM_PROCID numbers torchruns, not ranks)
                command = self.torchrun_worker[0]
            else:  # the rank's own task variables, over those srun gives its one-task step
                env.update(task_identity.carried(self.slurm_identity(launch, rank)))
                command = task_identity.as_task(self.command)
            argv = srun.replacement(command, launch=launch.number, generation=order.generation, rank=rank,
                                    node=node, extra=self.srun_args)  # fmt: skip
            log_path = self.log_dir / f"{name}.log"
            proc = self.start(argv, env, log_path, self.cwd)
            started.append(Replacement(rank, node, order.generation, name, proc, log_path))
        return started

    def rank_step_env(self, launch: Launch) -> dict[str, str]:
        """The environment of a one-rank step beside ``launch``'s (a rank started again, a standby): the attempt's,
        the launch's flight-recorder dumps, warm."""
        env = self.step_env(None)
        dumps = flight_dumps.dump_dir(launch.log_path)
        env.update(distenv.flight_recorder_env(str(dumps / flight_dumps.PREFIX), self.environ))
        env[ENV_WARM] = "1"
        return env

    def rank_identity(self, launch: Launch, rank: int) -> dict[str, str]:
        """The variables that make a process ``rank`` of ``launch`` (as the launch's own srun gave them), except
        those the user set for every rank."""
        if self.torchrun_worker is not None:  # torchrun's worker variables: the user's are torchrun's to read
            nproc = self.torchrun_worker[1]
            return torchrun_worker.worker_identity(rank, len(launch.nodes) * nproc, nproc, len(launch.nodes))
        tasks = self.layout.tasks_per_node
        own = {"WORLD_SIZE": str(len(launch.nodes) * tasks), "LOCAL_WORLD_SIZE": str(tasks), "RANK": str(rank),
               "LOCAL_RANK": str(rank % tasks), "NODE_RANK": str(rank // tasks)}  # fmt: skip
        return {k: v for k, v in own.items() if k not in self.environ}

    def slurm_identity(self, launch: Launch, rank: int) -> dict[str, str]:
        """Slurm's variables of ``rank``'s task in ``launch``'s step (SLURM_PROCID, SLURM_NTASKS, ...), for a
        process of its own one-task step that takes the rank (``task_identity``)."""
        return task_identity.identity(rank, len(launch.nodes), self.layout.tasks_per_node)

    def assignment(self, launch: Launch, order: RestartOrder, rank: int) -> RestartOrder:
        """A standby's assignment to take over ``rank`` in ``order``'s generation: the order and the rank's identity
        (torch's variables, and Slurm's unless under torchrun)."""
        slurm = self.slurm_identity(launch, rank) if self.torchrun_worker is None else {}
        return RestartOrder(order.generation, {**order.env, **self.rank_identity(launch, rank), **slurm})

    def start_standby(self, launch: Launch, node: str, standby: str, command: Sequence[str]) -> Standby:
        """Start a standby process (``command``: ``distenv.standby_command``) on ``node`` beside ``launch``, as its
        own one-task step."""
        name = srun.standby_job_name(launch.number, standby)
        argv = srun.standby(command, launch=launch.number, standby=standby, node=node, extra=self.srun_args)
        env = self.rank_step_env(launch)
        env.update({STANDBY_ENV: standby, HELPER_ENV: "standby"})
        log_path = self.log_dir / f"{name}.log"
        return Standby(standby, node, name, self.start(argv, env, log_path, self.cwd), log_path)

    def _dist_env(self, nodes: tuple[str, ...], moved: bool) -> distenv.DistEnv:
        """torch's env:// variables (and torchrun's defaults) for this launch; the user's own win."""
        user = self.environ
        master = user.get("MASTER_ADDR") or self.node_addresses.get(nodes[0]) or nodes[0]
        port = int(user["MASTER_PORT"]) if user.get("MASTER_PORT", "").isdigit() else distenv.pick_port(
            master, self.master_ports)
        self.master_ports.append(port)
        run_id = self.launch_tag(self.launches)
        return distenv.plan(nodes, self.layout.tasks_per_node, self.node_addresses, port, user, run_id, placed=moved,
                            node_rank_flag=distenv.static_rendezvous(self.command, user))


def start(argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: str | None = None) -> subprocess.Popen[bytes]:
    """Start a step; its output is appended to ``log_path`` (0600). A new session keeps terminal signals out."""
    log_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        return subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT,
            cwd=cwd or None, start_new_session=True,
        )  # fmt: skip
    finally:
        os.close(fd)


def kill_step(
    slurm: SlurmClient, job_id: str, name: str | Sequence[str], proc: Process, wait_s: float = 15.0,
    background: bool = False,
) -> int | None:
    """Kill a job step on every node at once (SIGKILL reaches stopped ranks too) and reap its srun.

    Falls back to signalling srun itself when Slurm no longer lists the step (or cannot be asked). Returns
    srun's exit code. ``background``: the step has a dead node, and scancel waits for that node's answer
    (MessageTimeout, 6 s on the local cluster) although the live nodes got the signal at once: it runs in a
    thread, and srun (which waits for the dead node's tasks forever) is killed after ``wait_s``.
    """

    names = (name,) if isinstance(name, str) else tuple(name)  # a warm-restarted launch: its ranks' own steps too

    def cancel() -> None:
        try:
            ids = slurm.step_ids(job_id)
            for step_id in (ids.get(n) for n in names):
                if step_id is not None:
                    slurm.cancel_step(step_id, "KILL")
        except SlurmError:
            pass  # the step ended meanwhile, or Slurm did not answer; srun is killed and reaped below either way

    if background:
        threading.Thread(target=cancel, name=f"scancel-{names[0]}", daemon=True).start()
    else:
        cancel()
    deadline = time.monotonic() + wait_s
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=5)
    return proc.returncode

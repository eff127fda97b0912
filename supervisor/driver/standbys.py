"""Standby ranks, the supervisor's part: keep a pool of pre-started processes beside a warm launch, hand one a dead
rank at a warm restart, cancel the idle ones when the launch ends.

The rules are in ``decisions/standbys.py`` (how many per node, when to start them, which takes which rank); this
only polls and acts: :meth:`Standbys.keep` runs on each pass of a warm launch's watch and starts what the rule
asks for (each standby its own one-task step, ``TrainingLauncher.start_standby``, journaled as ``standbys``);
:meth:`Standbys.take` gives the warm restart the standbys that take over its dead ranks (the restart sends each
its assignment through its node's agent); :meth:`Standbys.retire` cancels the idle ones (a cold relaunch, the
attempt's end). A standby that dies unassigned is dropped; after :data:`MAX_DEAD` such deaths in one attempt (the
program's interpreter cannot run ``supervisor.client.standby``, say) no more are started, and the journal says why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from slurm.client import SlurmClient
from supervisor.decisions import events as ev
from supervisor.decisions import standbys as rule
from supervisor.decisions.warm_restart import views_of
from supervisor.driver import distenv, torchrun_worker
from supervisor.driver.context import Context
from supervisor.driver.launcher import Launch, LaunchProcs, Standby, TrainingLauncher, kill_step

MAX_DEAD = 3
RETIRE_WAIT_S = 5.0


class Standbys:
    def __init__(self, ctx: Context, *, setting: str | int, command: Sequence[str], trainer: TrainingLauncher,
                 slurm: SlurmClient, job_id: str, ranks_of: Callable[[Launch], Sequence[Any]],
                 tasks_per_node: int, spares_of: Callable[[Launch], Sequence[str]] = lambda launch: ()) -> None:  # fmt: skip
        """``spares_of``: the allocation's usable nodes the launch does not run on (where a lost node's ranks go).
        ``tasks_per_node``: ranks per node (under ``srun torchrun``, each torchrun's workers)."""
        self.ctx, self.setting, self.trainer, self.slurm, self.job_id = ctx, setting, trainer, slurm, job_id
        self.ranks_of, self.tasks_per_node, self.spares_of = ranks_of, tasks_per_node, spares_of
        worker = getattr(trainer, "torchrun_worker", None)
        self.torchrun = distenv.runs_torchrun(command)
        if self.torchrun:  # a standby runs torchrun's worker command; a node's workers go (and come back) together
            self.command = torchrun_worker.standby_command(worker[0]) if worker is not None else None
            self.together = worker[1] if worker is not None else 1
        else:
            self.command, self.together = distenv.standby_command(command), 1
        self.idle: list[Standby] = []  # started for ``owner``, not assigned yet, oldest first
        self.owner: Launch | None = None
        self.started = 0
        self.dead = 0  # standbys that ended unassigned in this attempt
        self.said_why = False

    def per_node(self, launch: Launch) -> int:
        if self.dead >= MAX_DEAD:
            return 0
        return rule.per_node(self.setting, warm=launch.warm, plain_python=self.command is not None,
                             together=self.together)

    def keep(self, launch: Launch) -> None:
        """One pass of ``launch``'s watch: drop the standbys that died, start those the rule asks for."""
        if self.owner is not launch:
            self.retire()
            self.owner = launch
        spares = [] if self.torchrun else list(self.spares_of(launch))  # (a node's torchrun never moves warm)
        for standby in [s for s in self.idle if s.proc.poll() is not None]:
            self.idle.remove(standby)
            if standby.node not in launch.nodes and standby.node not in spares:
                continue  # its node was lost (or left out): not the standby's own failure
            self.dead += 1
            if self.dead == MAX_DEAD:
                self.say_why(launch, f"{MAX_DEAD} standby processes ended unassigned (see {standby.log_path.name})")
        per_node = self.per_node(launch)
        if per_node == 0:
            if launch.warm and self.command is None and self.setting not in ("off", 0):
                self.say_why(launch, "the training command is not `python SCRIPT`, `python -m MODULE` or torchrun "
                                     "running one: a standby cannot run it (warm restarts start dead ranks as new "
                                     "steps)")  # fmt: skip
            return
        want = rule.wanted(launch.nodes, spares, per_node=per_node, tasks_per_node=self.tasks_per_node)
        wanted = rule.to_start(want, Counter(s.node for s in self.idle), training=self.training(launch))
        if not wanted:
            return
        assert self.command is not None  # (per_node is 0 without one)
        started = {}
        for node in wanted:
            self.started += 1
            ident = str(self.started)
            self.idle.append(self.trainer.start_standby(launch, node, ident, self.command))
            started[ident] = node
        self.ctx.record(ev.standbys(self.ctx.clock(), launch.number, started))

    def training(self, launch: Launch) -> bool:
        """Whether every rank of ``launch`` trains now (stepped, none waiting for an order): standbys started
        earlier would slow its start."""
        ranks = list(self.ranks_of(launch))
        world = len(launch.nodes) * self.tasks_per_node
        views = {v.rank: v for v in views_of(ranks)}
        return len(views) == world and all(r.beats > 0 for r in ranks) and \
            all(v.alive and not v.awaiting for v in views.values())  # fmt: skip

    def take(self, launch: Launch, dead: Mapping[int, str]) -> dict[int, Standby]:
        """The idle standbys that take over ``dead`` ranks (rank -> node), removed from the pool."""
        if self.owner is not launch:
            return {}
        alive = [s for s in self.idle if s.proc.poll() is None]
        pools: dict[str, list[str]] = {}
        for s in alive:
            pools.setdefault(s.node, []).append(s.ident)
        by_id = {s.ident: s for s in alive}
        chosen = {rank: by_id[ident] for rank, ident in rule.assign(dead, pools).items()}
        for standby in chosen.values():
            self.idle.remove(standby)
        return chosen

    def retire(self) -> None:
        """Cancel the idle standbys (their launch ended, or the attempt does)."""
        idle, self.idle, self.owner = self.idle, [], None
        running = [s for s in idle if s.proc.poll() is None]
        if running:
            kill_step(self.slurm, self.job_id, [s.name for s in running], LaunchProcs([s.proc for s in running]),
                      wait_s=RETIRE_WAIT_S)  # fmt: skip

    def say_why(self, launch: Launch, why: str) -> None:
        if not self.said_why:
            self.said_why = True
            self.ctx.record(ev.standbys(self.ctx.clock(), launch.number, {}, why))

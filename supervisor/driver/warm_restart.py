"""Warm restart, the supervisor's part: a launch whose ranks restart in their processes (``client.restartable``)
is restarted by starting only its dead ranks again, instead of killing the step and launching every rank anew.

When the loop's decision is a restart in the allocation that a warm restart can carry out (:meth:`WarmRestarts.plan`:
``decisions.warm_restart.applies``, and for a hang the ranks to kill alone), the decision is carried out warm (its
stacks saved, only the hung ranks killed, the step left running); then :meth:`WarmRestarts.choose` reads the
launch's ranks from the agents' reports (alive, restartable, waiting for an order) and asks the pure rule until it
says warm or cold (a survivor may take a moment to let go of the failed process group). Warm: :meth:`WarmRestarts.restart` picks where to resume as a
relaunch would (the newest valid checkpoint, the memory tier's newest complete snapshot), sends every node's agent
the restart order (a new rendezvous port, the resume point, a new launch tag) which the agents write for the
waiting ranks, starts each dead rank again as its own one-task step on its node, and journals the restart as the
next launch (``step_launched`` with ``warm``, the generation and the ranks started again). The launch's log goes on
in the same file; each rank started again has its own. Cold: the reason is journaled and the loop relaunches as
before.

Which launches are warm (their srun survives one task's death, ``--kill-on-bad-exit=0``): ``[run] warm_restart``
"on", or "auto" once a launch of this run had every rank inside ``client.restartable``. Under ``srun torchrun`` a
task is a node's torchrun: a dead worker's torchrun stops the node's other workers and exits, so that node's ranks
are started again as torchrun's workers would be, without it (driver/torchrun_worker.py); a torchrun whose workers
cannot be read from the command, or a restart that moves a node's ranks, stays cold.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from supervisor.client.layout import RANK_FLAG_RESTARTABLE
from supervisor.client.restart_order import RestartOrder
from supervisor.decisions import events as ev
from supervisor.decisions import warm_restart as rule
from supervisor.decisions.classify import Interruption
from supervisor.decisions.detect import DetectionEvent
from supervisor.decisions.policy import Decision
from supervisor.driver import distenv
from supervisor.driver.context import Context
from supervisor.driver.launcher import Launch, LaunchProcs, Standby, TrainingLauncher
from supervisor.driver.ports import Channel
from supervisor.driver.rank_kill import kill_ranks
from supervisor.driver.standbys import Standbys
from supervisor.heartbeat.orders import assign_order_text, restart_order_text

ORDER_RESEND_S = 0.5  # the order travels in datagrams: sent again until the waiting ranks took it
ORDER_TAKEN_WAIT_S = 10.0


class WarmRestarts:
    def __init__(self, ctx: Context, *, mode: str, command: Sequence[str], channel: Channel,
                 trainer: TrainingLauncher, ranks_of: Callable[[Launch], Sequence[Any]], tasks_per_node: int,
                 release_deadline_s: float = rule.DEFAULT_RELEASE_DEADLINE_S,
                 standbys: Standbys | None = None) -> None:  # fmt: skip
        self.ctx, self.mode, self.channel, self.trainer, self.standbys = ctx, mode, channel, trainer, standbys
        self.ranks_of, self.tasks_per_node, self.release_deadline_s = ranks_of, tasks_per_node, release_deadline_s
        self.torchrun = distenv.runs_torchrun(command)
        self.cold_only = self.torchrun and trainer.torchrun_worker is None  # torchrun's workers unknown
        self.seen_restartable = False  # "auto": a launch of this run had every rank inside client.restartable
        self.placed: tuple[str, ...] | None = None  # the planned restart's nodes in rank order (ranks moved to spares)

    def next_launch_warm(self) -> bool:
        """Whether the next launch is started warm (its step survives one task's death)."""
        if self.cold_only or self.mode == "off":
            return False
        return self.mode == "on" or self.seen_restartable

    def saw(self, launch: Launch) -> None:
        """After a launch's watch: whether every one of its ranks ran inside ``client.restartable`` ("auto")."""
        if self.seen_restartable or self.mode != "auto" or self.cold_only:
            return
        ranks = list(self.ranks_of(launch))
        world = len(launch.nodes) * self.trainer.ranks_per_node
        if len({r.rank for r in ranks}) == world and all(r.rank_flags & RANK_FLAG_RESTARTABLE for r in ranks):
            self.seen_restartable = True

    def views(self, launch: Launch) -> list[rule.RankView]:
        return rule.views_of(self.ranks_of(launch))

    def plan(self, launch: Launch, interruption: Interruption, decision: Decision,
             detections: Sequence[DetectionEvent]) -> tuple[int, ...] | None:  # fmt: skip
        """None: ``decision`` is carried out cold (a cold launch, or not a decision a warm restart carries out);
        else the ranks to kill alone first (a hang's), () for none."""
        self.placed = None
        if not launch.warm or not rule.applies(decision, interruption.cls, launch.nodes):
            return None
        kill = rule.hung_ranks(interruption.cls, detections)
        if kill is not None:
            self.placed = rule.placement_after(decision, launch.nodes)
            if self.torchrun and self.placed != launch.nodes:  # a node's torchrun cannot move: cold
                self.placed = None
                return None
        return kill

    def moving(self, launch: Launch) -> frozenset[str]:
        """The nodes of ``launch`` the planned restart moves ranks off (left out by the decision: lost, blamed)."""
        return frozenset(launch.nodes) - frozenset(self.placed or launch.nodes)

    def move(self, launch: Launch) -> tuple[str, ...]:
        """Give ``launch`` the planned restart's nodes (ranks of a node left out go to a spare, the others keep
        theirs); returns the nodes left out."""
        left = tuple(n for n in launch.nodes if n in self.moving(launch))
        if self.placed is not None:
            launch.nodes = self.placed
        return left

    def choose(self, launch: Launch, interruption: Interruption) -> rule.WarmChoice:
        """Warm or cold for a restart of ``launch`` carried out warm so far (:meth:`plan`); waits while the rule
        says so. A cold answer is journaled with its reason."""
        started = time.monotonic()
        killed: set[int] = set()
        while True:
            bad = set(interruption.blamed_nodes) | self.moving(launch)
            views = self.views(launch)
            if self.torchrun:  # a dead worker's node-mates go with it: started again, never kept
                doomed = set(rule.doomed_with_their_node(views))
                if doomed - killed:
                    killed.update(doomed)
                    kill_ranks(self.ctx, self.channel, views, doomed, "their node's torchrun stops them (a worker "
                               "of the node died): started again with it")  # fmt: skip
                views = [dataclasses.replace(v, alive=False) if v.rank in doomed else v for v in views]
            waited = time.monotonic() - started
            choice = rule.choose(views, enabled=True, bad_nodes=bad,
                                 shrinks=False, in_progress=self.in_progress(launch),
                                 waited_s=waited, release_deadline_s=self.release_deadline_s)  # fmt: skip
            if choice.kind != rule.WAIT:
                break
            self.release_stuck(launch, views, waited, killed)
            self.channel.poll(0.1)
        if choice.kind == rule.COLD:
            self.ctx.record(ev.warm_restart_skipped(self.ctx.clock(), launch.number, choice.reason))
        return choice

    def release_stuck(self, launch: Launch, views: Sequence[rule.RankView], stuck_s: float, killed: set[int]) -> None:
        """While the survivors are awaited: ranks still in a collective ``stuck_s`` after the verdict while others
        wait are ended by their agents, as the watch does (``rule.hung_by_peers``: every waiting rank failed on a
        peer, so the stuck ones are the hung ones; ``rule.holding_back``: a rank waiting on its own error whose
        group kept its connections): they are then started again with the dead. Seen under torchrun: a rank stayed
        in its all_reduce after both ranks of another node had died, its peer on its node waiting (the waiting
        rank's group kept its connections: client/restart.py). Under torchrun a node's workers go together."""
        kill = (set(rule.hung_by_peers(views, stuck_s)) | set(rule.holding_back(views, stuck_s))) - killed
        if kill and self.torchrun:  # its torchrun stops the node's other workers when one ends: all of them, now
            nodes_of = {v.node for v in views if v.rank in kill}
            kill |= {v.rank for v in views if v.node in nodes_of and v.alive}
            kill -= killed
        killed.update(kill)
        kill_ranks(self.ctx, self.channel, views, kill, "still in the failed collective while the others wait for "
                   "the restart order: started again with the dead ranks")  # fmt: skip

    def in_progress(self, launch: Launch) -> bool:
        """Whether the launch's last warm restart never trained: a rank it started again is gone, or has not
        stepped yet."""
        newest = [r for r in launch.replaced if r.generation == launch.generation]
        if not newest:
            return False
        views = {v.rank: v for v in self.ranks_of(launch)}
        return any(r.rank not in views or views[r.rank].beats == 0 or views[r.rank].pid == 0 for r in newest)

    def node_of(self, launch: Launch, rank: int) -> str:
        """The node ``rank`` of ``launch`` runs on (a dead rank: ran on); :meth:`placement`."""
        return self.placement(launch)[rank]

    def placement(self, launch: Launch) -> dict[int, str]:
        """Every rank of ``launch`` -> its node: srun's block layout, or under torchrun where its rendezvous put
        the rank (the agents' reports say; the layout for a rank they never reported). One pass over the ranks."""
        per_node, nodes = self.trainer.ranks_per_node, launch.nodes
        where = {r: nodes[min(r // per_node, len(nodes) - 1)] for r in range(len(nodes) * per_node)}
        if self.torchrun:
            where.update({v.rank: str(v.node) for v in self.ranks_of(launch) if v.rank in where and v.node})
        return where

    def take_standbys(self, launch: Launch, choice: rule.WarmChoice) -> dict[int, Standby]:
        """The standbys that take over ``choice``'s dead ranks (on their nodes); the others start as new steps."""
        if self.standbys is None:
            return {}
        where = self.placement(launch)
        return self.standbys.take(launch, {r: where[r] for r in choice.replace})

    def restart(self, launch: Launch, choice: rule.WarmChoice, order: RestartOrder,
                taken: Mapping[int, Standby] | None = None) -> tuple[list[int], tuple[int, ...]]:  # fmt: skip
        """Carry out a warm choice: the order to every node's agent, the dead ranks given to ``taken`` standbys or
        started again, the orders repeated until the ranks took them. Returns the pids of the ranks replaced
        (their views are gone) and the kept ranks that never took the order (the restart cannot go on warm)."""
        taken = dict(taken or {})
        dead = [v.pid for v in self.ranks_of(launch) if v.rank in choice.replace]
        text = restart_order_text(order)
        for node in launch.nodes:
            self.channel.send_order(node, text)
        assigns = {rank: (standby.node, assign_order_text(standby.ident, self.trainer.assignment(launch, order, rank)))
                   for rank, standby in taken.items()}  # fmt: skip
        for node, assign in assigns.values():
            self.channel.send_order(node, assign)
        where = self.placement(launch)
        rest = {r: where[r] for r in choice.replace if r not in taken}
        # the training step's tasks of the ranks started elsewhere: srun's report of their end is this fault's
        nodes = {where[r] for r in choice.replace}
        tasks = {i for i, n in enumerate(launch.nodes) if n in nodes} if self.torchrun else set(choice.replace)
        launch.reader.settle_tasks(sorted(tasks))
        started = self.trainer.start_again(launch, order, rest)
        started += [standby.as_rank(rank, order.generation) for rank, standby in taken.items()]
        launch.generation = order.generation
        launch.replaced.extend(started)
        for rep in started:  # its traceback, if it fails, is in its own log
            launch.reader.add_rank_log(rep.rank, rep.log_path)
        procs = launch.proc if isinstance(launch.proc, LaunchProcs) else LaunchProcs([launch.proc])
        for rep in started:
            procs.add(rep.proc)
        launch.proc = procs
        untaken = self.until_taken(launch, choice, text, assigns, set(dead))
        return dead, untaken

    def until_taken(self, launch: Launch, choice: rule.WarmChoice, text: str,
                    assigns: Mapping[int, tuple[str, str]] | None = None,
                    gone: set[int] | None = None) -> tuple[int, ...]:  # fmt: skip
        """Send the orders again (datagrams may be lost) until no kept rank still waits for the restart order and
        every standby given a rank shows up as that rank (a process not among ``gone``, the replaced ranks' pids),
        at most ``ORDER_TAKEN_WAIT_S``. Returns the kept ranks still waiting then: a rank takes its order within
        a poll of its arrival, so one that did not in all that time never will (a standby slow to show up as its
        rank is left to the watch: its program may take long to reach the client)."""
        assigns, gone = assigns or {}, gone or set()
        deadline = time.monotonic() + ORDER_TAKEN_WAIT_S
        next_send = time.monotonic() + ORDER_RESEND_S
        while time.monotonic() < deadline:
            ranks = list(self.ranks_of(launch))
            waiting = [v for v in rule.views_of(ranks) if v.rank not in choice.replace and v.awaiting]
            unseen = [rank for rank in assigns if rank not in {r.rank for r in ranks if r.pid not in gone}]
            if not waiting and not unseen:
                return ()
            if time.monotonic() >= next_send:
                for node in sorted({v.node for v in waiting}):
                    self.channel.send_order(node, text)
                for rank in unseen:
                    self.channel.send_order(*assigns[rank])
                next_send = time.monotonic() + ORDER_RESEND_S
            self.channel.poll(0.05)
        return tuple(sorted(v.rank for v in rule.views_of(self.ranks_of(launch))
                            if v.rank not in choice.replace and v.awaiting))  # fmt: skip

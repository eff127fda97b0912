"""The node agents' job step: one overlapping srun task per node that outlives relaunches of the training.

Started before the first launch (a rank's slot directory must exist before it looks for it), restarted when
the step dies under a failed node, told to exit at the end. Each start or gap is journaled.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from slurm import srun
from slurm.client import SlurmClient
from slurm.errors import SlurmError
from supervisor.decisions import events as ev
from supervisor.driver.context import Context
from supervisor.driver.ports import Channel, Process, StepLauncher
from supervisor.heartbeat import wire

AGENT_START_TIMEOUT_S = 60.0  # node agents start with the python interpreter: seconds on a loaded node
AGENT_RESTART_MIN_S = 10.0  # at most one restart of the agents' step per this many seconds


class AgentStep:
    def __init__(
        self, ctx: Context, *, channel: Channel, slurm: SlurmClient, start: StepLauncher, nodes: tuple[str, ...],
        python: str, campaign: Path, extra_args: Sequence[str], env: Mapping[str, str], log_path: Path,
        cwd: str | None, avoid: Collection[str] = (),
    ) -> None:  # fmt: skip
        """``env``: the agents' environment; ``avoid``: the nodes found lost (a live set: a node added later is never
        given an agent again in this attempt)."""
        self.ctx, self.record, self.clock = ctx, ctx.record, ctx.clock
        self.channel, self.slurm, self.start_step = channel, slurm, start
        self.nodes, self.python, self.campaign, self.extra_args = nodes, python, campaign, list(extra_args)
        self.env, self.log_path, self.cwd, self.avoid = dict(env), log_path, cwd, avoid
        self.proc: Process | None = None
        self.started = 0.0

    def spawn(self, nodes: tuple[str, ...]) -> None:
        host, port = self.channel.address
        argv = srun.agents(nodes, [self.python, "-m", "supervisor.agent", "--campaign", str(self.campaign),
                                   "--supervisor", f"{host}:{port}", "--not-before-ns", str(time.time_ns()),
                                   *self.extra_args])  # frames recorded for earlier agents are replays to these  # fmt: skip
        self.proc = self.start_step(argv, self.env, self.log_path, self.cwd)
        self.started = time.monotonic()

    def wait_until_reported(self, timeout_s: float = AGENT_START_TIMEOUT_S) -> None:
        """Launch the training only once every node's agent reported: its slot directory must exist before
        the ranks look for it. A node whose agent stays silent is journaled; training goes on unwatched there."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            self.channel.poll(0.1)
            if set(self.nodes) <= set(self.channel.table.nodes):
                return
        missing = sorted(set(self.nodes) - set(self.channel.table.nodes))
        self.record(ev.agents_missing(self.clock(), missing,
                                      "node agents did not report in time; ranks there run without heartbeats"))

    def wait_until_fresh(self, stale_s: float, timeout_s: float) -> list[str]:
        """Before a relaunch after the agents went silent: wait (up to ``timeout_s``) until every node's agent
        reported within ``stale_s``, so the new launch is not judged on the old silence. Returns the nodes still
        silent (journaled: their ranks run unwatched until their agents speak again)."""
        deadline = time.monotonic() + timeout_s
        while True:
            views = self.channel.table.node_views()
            stale = [n for n in self.nodes if n not in self.avoid and (n not in views or views[n].staleness_s > stale_s)]
            if not stale or time.monotonic() >= deadline or self.died():
                break
            self.channel.poll(0.1)
        if stale:
            self.record(ev.agents_missing(self.clock(), stale, "node agents still silent before the relaunch; "
                                          "ranks there run without heartbeats until they report"))  # fmt: skip
        return stale

    def died(self) -> bool:
        return self.proc is not None and self.proc.poll() is not None

    def restart(self) -> None:
        """The agents' step died (a node failed under it): start it again on the nodes Slurm still has up."""
        if time.monotonic() - self.started < AGENT_RESTART_MIN_S:
            return
        try:
            down = {n.name for n in self.slurm.nodes(self.nodes or None) if n.is_down or n.is_drain}
        except SlurmError:
            down = set()  # unknown: try every node; an agent on a dead node just fails again
        nodes = tuple(n for n in self.nodes if n not in down and n not in self.avoid)
        self.record(ev.agents_restarted(self.clock(), nodes))
        self.spawn(nodes)

    def stop(self, wait_s: float = 5.0) -> None:
        """Ask every agent to exit, then end their srun: ``wait_s`` for each of exit, SIGTERM, SIGKILL. With a
        lost node srun never exits by itself (it waits for the dead node's task): the caller passes a short wait,
        or a requeued job's KillWait would SIGKILL us first (and the job stays COMPLETING until then)."""
        for node in self.nodes:
            self.channel.send(node, [wire.Command(wire.CMD_EXIT)])
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        for end in (None, proc.terminate, proc.kill):
            if end is not None:
                end()
            try:
                proc.wait(timeout=wait_s if end is not proc.kill else 5)
                return
            except Exception:  # noqa: BLE001 - subprocess.TimeoutExpired (or a fake's equivalent): escalate
                continue

"""The failsafe: when the supervisor itself is lost, nothing may keep running unsupervised.

A job with spare nodes runs with ``--no-kill``: if its batch host dies, Slurm keeps the rest of the allocation
RUNNING (on 22.05, until the time limit) with nobody watching. So the node agents watch the supervisor: once no
control frame (keepalive, command) has come for ``timeout_s`` (or the kernel says its port is closed), the
agent on the lowest-named surviving node (the batch host excluded) probes the batch host (``slurm/probe.py``);
when that fails too, it requeues the job with the batch host added to the job's ExcNodeList, or cancels the job
when Slurm refuses the requeue. The next Slurm run continues the campaign from the journal, where the agent
wrote a ``failsafe`` event.

"Lowest-named surviving" without talking to each other: candidates are the job's nodes in name order; the
agent at position ``i`` waits ``i * stagger_s`` before acting and acts only while the job is still RUNNING in
the same Slurm run (same restart count), so the first one alive does it and the others find it done. Only the
first ``MAX_TURNS`` candidates ever act.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from slurm.errors import SlurmError
from slurm.probe import DEFAULT_TIMEOUT_S, ProbeStarter

MAX_TURNS = 4
REQUEUE = "requeue"
CANCEL = "cancel"
EXCLUDE_TRIES = 10  # ExcNodeList is accepted once the requeued job is COMPLETING: a few tries, 0.3 s apart


def turn(node: str, nodes: Sequence[str], batch_host: str | None) -> int | None:
    """This node's place among the candidates (0 acts first), or None when it never acts (the batch host
    itself, a node not in the job, or past ``MAX_TURNS``)."""
    candidates = sorted(n for n in set(nodes) if n != batch_host)
    if node not in candidates:
        return None
    place = candidates.index(node)
    return place if place < MAX_TURNS else None


class Failsafe:
    def __init__(
        self,
        *,
        job_id: str,
        node: str,
        batch_host: str,
        nodes: Sequence[str],
        restart_count: int,
        campaign: Path,
        timeout_s: float,
        start_probe: ProbeStarter,
        slurm: Any = None,
        probe_timeout_s: float = DEFAULT_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.job_id, self.node, self.batch_host, self.nodes = job_id, node, batch_host, list(nodes)
        self.restart_count, self.campaign, self.timeout_s = restart_count, campaign, timeout_s
        self.start_probe, self._slurm, self.probe_timeout_s = start_probe, slurm, probe_timeout_s
        self.clock, self.sleep = clock, sleep
        self.turn = turn(node, nodes, batch_host)
        self.stagger_s = probe_timeout_s + 2.0  # the one before us probes, requeues and excludes within this
        self.next_check = 0.0  # monotonic: a probe that found the batch host alive is not repeated before this
        self.tried = False  # this agent had its turn (the batch host answered, or it acted)
        self.done = ""

    @property
    def slurm(self) -> Any:
        if self._slurm is None:
            from slurm.client import get_client

            self._slurm = get_client()
        return self._slurm

    @property
    def waiting(self) -> bool:
        """This agent may still have to act: it must not exit before its turn came."""
        return self.turn is not None and not self.tried and not self.done

    def due(self, gone_for_s: float, now: float) -> bool:
        """Whether to act now: the supervisor has been gone ``gone_for_s`` (counted from the moment it was
        found gone), this agent may act, its turn has come, and no recent probe found the batch host up."""
        if self.turn is None or self.done:
            return False
        return gone_for_s >= self.turn * self.stagger_s and now >= self.next_check

    def act(self, why: str, now: float) -> str:
        """Probe the batch host; if it is gone and the job still runs in this Slurm run, requeue it without
        the batch host (or cancel it). Returns what was done ("" when nothing: the host answered)."""
        self.tried = True
        probe = self.start_probe(self.batch_host, self.probe_timeout_s)
        result = None
        while result is None:
            self.sleep(0.1)
            result = probe.result()
        alive, detail = result
        if alive:
            self.next_check = now + max(self.timeout_s, 10.0)
            return ""
        try:
            job = self.slurm.job(self.job_id)
        except SlurmError as err:
            self.next_check = now + 5.0
            return f"could not read the job ({err}); will try again"
        if job is None or not job.is_running or job.restart_count != self.restart_count:
            self.done = "another agent (or Slurm) already ended this run"
            return self.done
        reason = f"{why}; batch host {self.batch_host} does not answer ({detail})"
        try:
            self.slurm.requeue(self.job_id)
            action = REQUEUE
        except SlurmError as err:
            reason += f"; requeue refused ({err}), cancelled"
            action = CANCEL
            try:
                self.slurm.cancel(self.job_id)
            except SlurmError as err2:
                reason += f"; cancel failed too ({err2})"
        excluded = self._exclude() if action == REQUEUE else []
        self._journal(action, reason, excluded)
        self.done = f"{action} of job {self.job_id}" + (f" without {', '.join(excluded)}" if excluded else "")
        return self.done

    def _exclude(self) -> list[str]:
        """Add the batch host to the job's ExcNodeList (replaced, not extended: the current list is read first).
        Slurm takes it once the requeued job is COMPLETING or PENDING."""
        for _ in range(EXCLUDE_TRIES):
            try:
                job = self.slurm.job(self.job_id)
                current = set(job.excluded_nodes) if job is not None else set()
                wanted = sorted(current | {self.batch_host})
                self.slurm.update_excluded_nodes(self.job_id, wanted)
                return wanted
            except SlurmError:
                self.sleep(0.3)
        return []

    def _journal(self, action: str, reason: str, excluded: list[str]) -> None:
        from supervisor.decisions import events as ev
        from supervisor.journal import Journal, JournalError
        from supervisor.paths import CampaignPaths

        events = [ev.failsafe(self.clock(), self.node, action, self.batch_host, self.job_id, reason, excluded)]
        if action == CANCEL:
            events.append(ev.campaign_ended(self.clock(), "failed", f"the supervisor's batch host was lost and "
                                            f"Slurm refused the requeue: {reason}"))  # fmt: skip
        try:
            journal = Journal(CampaignPaths(self.campaign).journal)
        except (JournalError, OSError) as err:  # the dead supervisor's lock (a network filesystem): say it
            print(f"supervisor agent: failsafe not journaled ({err}): {events[0]}", flush=True)
            return
        try:
            for e in events:
                journal.append(e)
        finally:
            journal.close()

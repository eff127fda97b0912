"""Which of a launch's detections end its watch, and when. Pure: the watch (``driver/watch.py``) feeds it each
pass's detections and what it sees of the ranks; it answers whether to go on.

The rules, each learned on the real cluster:

* A warning (straggler, loss spike) never ends the launch: it is journaled and answered by the policy.
* Ranks exit one by one at the end of a launch, and srun (``--kill-on-bad-exit``) ends the job step at once on a
  real crash; so a rank gone while srun still runs is *pending*: a fault only once it has been gone longer than
  the exit grace (:func:`exit_grace_s`) and its peers did not all end too (srun, tearing the step down, then
  reports how each task ended: its evidence is better, so it gets up to ``ALL_EXITED_GRACE_S``).
* A hang needs a live agent saying the process is there: while some node is quiet and not judged yet, a hang is
  *held* (the node's loss, its peers stuck in a collective, would be misread as a hang) and decided once the
  node-loss verdict is in.
* torchrun restarting its workers inside the launch (``--max-restarts`` > 0) brings exited ranks back: their
  exits are dropped (:func:`back_again`).
* Every fault of one pass ends the watch together (all agents silent at once is one finding, not one per node).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from supervisor import procstate
from supervisor.decisions.detect.findings import HANG_KINDS, RANK_EXITED, DetectionEvent
from supervisor.decisions.detect.hang import finished_normally

EXIT_GRACE_S = 5.0  # a rank gone while srun still runs for this long is a fault (not a normal finish)
# Every rank of the launch gone while srun still runs: srun is tearing the step down (seconds on a loaded machine);
# its exit code and task report are the evidence, so wait for it this long before calling it a fault.
ALL_EXITED_GRACE_S = 60.0


def back_again(pending: Sequence[DetectionEvent], ranks: Iterable[Any]) -> list[DetectionEvent]:
    """``pending`` without the exits of ranks that run again (a live process under the same rank: torchrun
    restarted its workers inside the launch; counted from its log at the launch's end)."""
    alive = {r.rank for r in ranks if r.state not in procstate.ENDED}
    return [d for d in pending if not (d.kind == RANK_EXITED and d.ranks and set(d.ranks) <= alive)]


def exit_grace_s(pending: Sequence[DetectionEvent], ranks: Sequence[Any], worker_restarts: bool,
                 finish_allowance_s: float) -> float:  # fmt: skip
    """How long srun may outlive exited ranks: ``EXIT_GRACE_S`` after a crash; after normal exits (code 0 or
    atexit ran) the peers are finishing too and get the detector's finish allowance; under torchrun's own
    restarts, the time it takes to stop the group's other workers and rendezvous again."""
    if worker_restarts:
        return ALL_EXITED_GRACE_S
    exited = {r for d in pending if d.kind == RANK_EXITED for r in d.ranks}
    views = [r for r in ranks if r.rank in exited]
    if views and len({r.rank for r in views}) == len(exited) and all(map(finished_normally, views)):
        return max(EXIT_GRACE_S, finish_allowance_s)
    return EXIT_GRACE_S


@dataclass(frozen=True)
class PassVerdict:
    """One pass's answer: the warnings to journal, and the detections that end the watch (None: go on)."""

    warnings: tuple[DetectionEvent, ...] = ()
    ending: tuple[DetectionEvent, ...] | None = None


@dataclass
class Triage:
    """The watch's memory of one launch: rank exits waiting for the grace time, hangs waiting for a node-loss
    verdict. ``worker_restarts``: torchrun may restart its workers inside this launch."""

    worker_restarts: bool = False
    finish_allowance_s: float = 0.0
    pending: list[DetectionEvent] = field(default_factory=list)  # rank exits, not faults yet
    held: list[DetectionEvent] = field(default_factory=list)  # hangs waiting for the verdict on a quiet node
    exited_since: float | None = None  # when the first pending exit was seen (monotonic seconds)

    def sort(self, found: Iterable[DetectionEvent], now: float, nodes_undecided: bool) -> PassVerdict:
        """One pass of detections. ``nodes_undecided``: some node is quiet without a node-loss verdict yet."""
        warnings: list[DetectionEvent] = []
        faults: list[DetectionEvent] = []
        for d in found:
            if not d.is_fault:
                warnings.append(d)
            elif d.kind == RANK_EXITED:
                self.pending.append(d)
                self.exited_since = self.exited_since if self.exited_since is not None else now
            elif d.kind in HANG_KINDS and nodes_undecided:
                self.held.append(d)
            else:
                faults.append(d)
        if faults:
            return PassVerdict(tuple(warnings), (*self.pending, *self.held, *faults))
        if self.held and not nodes_undecided:
            return PassVerdict(tuple(warnings), (*self.pending, *self.held))
        return PassVerdict(tuple(warnings))

    def exits_overdue(self, now: float, ranks: Sequence[Any]) -> bool:
        """Whether the pending exits are a fault now (``ranks``: the launch's rank views this pass)."""
        if self.pending and self.worker_restarts:  # torchrun restarted them: new processes under the same ranks
            self.pending = back_again(self.pending, ranks)
            if not any(d.kind == RANK_EXITED for d in self.pending):
                self.exited_since = None
        if self.exited_since is None:
            return False
        gone_s = now - self.exited_since
        all_ended = bool(ranks) and all(r.state in procstate.ENDED for r in ranks)
        grace = exit_grace_s(self.pending, ranks, self.worker_restarts, self.finish_allowance_s)
        return gone_s > grace and (gone_s > ALL_EXITED_GRACE_S or not all_ended)

    def with_pending(self, more: Iterable[DetectionEvent] = ()) -> tuple[DetectionEvent, ...]:
        """The pending exits (and ``more``): what an ending for another reason carries along."""
        return (*self.pending, *more)

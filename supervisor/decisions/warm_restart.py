"""Warm or cold: after the policy chose to restart the training in its allocation, whether the launch can restart in
its processes (only the broken ranks started again) or must be relaunched cold (every rank a new process).

WHY a separate rule: the policy decides *whether* to restart (budgets, blame, the crash-loop guard); this decides
*how*, from what the ranks say in their slots. A warm restart needs every rank that stays to be able to restart
in its process (``client.restartable``: ``restartable``) and to have let go of the failed process group and to wait
for the order (``awaiting``); a rank that has not yet let go may still do so (its peers' sockets close one after
another), so until ``release_deadline_s`` the answer is :data:`WAIT`. The ranks replaced are those dead and those on
a node that must not run them (blamed or lost, moved to a spare by the placement); they are started again as new
processes in the same rank. Anything else is cold, with the reason the journal gives:

- warm restart off for the campaign, or the program does not restart in place (a rank is not ``restartable``);
- a fault while a warm restart was under way (its generation never trained): a second try warm could wedge;
- the world would shrink (no spare for a lost node): every rank reloads a resharded state, so a new launch;
- a surviving rank did not let go in time (stuck in a collective the backend does not abort, or not the client's
  doing): only killing the step frees it;
- nothing to keep: every rank is replaced.

Which decisions a warm restart may carry out (:func:`applies`): a restart in the allocation without a save first
(a stop-and-save needs the ranks to end), without a roll back (no rank died: nothing makes them wait) and without
nodes to leave out. :func:`hung_ranks` names the ranks a hang's warm restart kills alone (a stopped or silent
rank; a stall of everyone names nobody: cold). :func:`as_warm` turns such a decision into the warm one: instead of
killing the step, only the hung ranks are killed (``kill_ranks``, after their stacks were saved; their peers'
collectives then fail and they wait), and ``warm_restart`` replaces the relaunch.

Pure: no I/O; property-tested (tests/unit/test_warm_restart_decision.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from supervisor import procstate
from supervisor.client.layout import RANK_FLAG_AWAITING_RESTART, RANK_FLAG_PEER_FAILED, RANK_FLAG_RESTARTABLE
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions.detect.findings import RANK_HANG, RANK_STOPPED, DetectionEvent

WAIT = "wait"
WARM = "warm"
COLD = "cold"
DEFAULT_RELEASE_DEADLINE_S = 20.0  # a survivor blocked on a dead peer's socket fails in well under a second on gloo


@dataclass(frozen=True)
class RankView:
    """One rank of the failed launch, as its node agent saw it last."""

    rank: int
    node: str
    alive: bool  # its process exists (a stopped or hung one counts as alive until killed)
    restartable: bool  # it trains inside client.restartable
    awaiting: bool  # it let go of the failed process group and waits for its order
    peer_failed: bool = False  # awaiting because a collective failed on a peer, not because of its own error


@dataclass(frozen=True)
class WarmChoice:
    kind: str  # WAIT, WARM or COLD
    replace: tuple[int, ...] = ()  # WARM: the ranks started again as new processes
    reason: str = ""  # COLD: why, for the journal; WARM: what is kept

    @property
    def warm(self) -> bool:
        return self.kind == WARM


def choose(
    ranks: Sequence[RankView], *, enabled: bool, bad_nodes: Iterable[str], shrinks: bool, in_progress: bool,
    waited_s: float, release_deadline_s: float = DEFAULT_RELEASE_DEADLINE_S,
) -> WarmChoice:  # fmt: skip
    """Warm, cold or wait, for a restart in the allocation the policy already decided. ``bad_nodes``: nodes whose
    ranks must move (blamed, lost); ``shrinks``: the next launch has fewer ranks; ``in_progress``: the fault came
    while a warm restart's generation had not yet trained; ``waited_s``: since the fault was seen."""
    if not enabled:
        return WarmChoice(COLD, reason="warm restart is off ([run] warm_restart)")
    if not ranks:
        return WarmChoice(COLD, reason="no rank of the launch was seen")
    if in_progress:
        return WarmChoice(COLD, reason="a second fault during a warm restart")
    if shrinks:
        return WarmChoice(COLD, reason="the world shrinks (no spare for a lost node): every rank reloads resharded")
    bad = frozenset(bad_nodes)
    replace = tuple(sorted(r.rank for r in ranks if not r.alive or r.node in bad))
    keep = [r for r in ranks if r.rank not in replace]
    # only the ranks kept must restart in their processes: a dead one is started anew (and its last report may
    # have lost its flags with its slot)
    not_restartable = sorted(r.rank for r in keep if not r.restartable)
    if not_restartable:
        return WarmChoice(COLD, reason=f"rank {not_restartable[0]} does not restart in its process "
                                       "(the program does not use client.restartable)")  # fmt: skip
    if not keep:
        return WarmChoice(COLD, reason="every rank is replaced: nothing to keep")
    holding = sorted(r.rank for r in keep if not r.awaiting)
    if holding:
        if waited_s < release_deadline_s:
            return WarmChoice(WAIT, replace=replace)
        return WarmChoice(COLD, reason=f"rank {holding[0]} did not let go of the failed process group within "
                                       f"{release_deadline_s:g} s")  # fmt: skip
    return WarmChoice(WARM, replace=replace, reason=f"{len(keep)} of {len(ranks)} ranks keep their processes")


def views_of(ranks: Iterable[Any]) -> list[RankView]:
    """The rule's view of the agents' rank reports (``heartbeat.table.RankView``: state and slot flags)."""
    return [RankView(r.rank, r.node, r.state not in procstate.ENDED, bool(r.rank_flags & RANK_FLAG_RESTARTABLE),
                     bool(r.rank_flags & RANK_FLAG_AWAITING_RESTART), bool(r.rank_flags & RANK_FLAG_PEER_FAILED))
            for r in ranks]  # fmt: skip


def doomed_with_their_node(ranks: Sequence[RankView]) -> tuple[int, ...]:
    """Under ``srun torchrun``: the ranks still alive on a node where a rank died. Their torchrun stops them (it
    ends its node's worker group when one worker fails), however long they take to go (a program that catches
    SIGTERM waits for its next step): they are started again with the dead, never kept."""
    dead_nodes = {r.node for r in ranks if not r.alive}
    return tuple(sorted(r.rank for r in ranks if r.alive and r.node in dead_nodes))


def survivors_wait(ranks: Sequence[RankView]) -> bool:
    """Whether a warm launch's watch can end now: every rank still alive waits for its order, because a rank is
    gone (the exit grace that tells a crash from ranks finishing one by one is not needed: the survivors said it
    failed) or because the training raised in every rank (a rank's own exception, which its peers' collectives
    then share: nobody exits, and without this the launch would wait for the ranks to give up)."""
    alive = [r for r in ranks if r.alive]
    return bool(alive) and all(r.awaiting for r in alive)


HOLD_BACK_GRACE_S = 5.0  # peers blocked on a waiting rank fail within a second when its group really closed


def holding_back(ranks: Sequence[RankView], stuck_s: float, grace_s: float = HOLD_BACK_GRACE_S) -> tuple[int, ...]:
    """The waiting ranks to kill so that their peers' collectives fail: some ranks wait for their order after
    their own error while others, alive, neither step nor wait (``stuck_s``: for how long); a waiting rank's failed
    group may still hold its connections open, and only its process's end closes them for sure. A rank that waits
    because a collective failed on a peer (``peer_failed``) is not holding anyone back: never killed here (the
    stuck one is then hung: :func:`hung_by_peers`). () while within ``grace_s`` or when nobody waits."""
    waiting = tuple(sorted(r.rank for r in ranks if r.alive and r.awaiting and not r.peer_failed))
    others = [r for r in ranks if r.alive and not r.awaiting]
    return waiting if waiting and others and stuck_s >= grace_s else ()


def hung_by_peers(ranks: Sequence[RankView], stuck_s: float, grace_s: float = HOLD_BACK_GRACE_S) -> tuple[int, ...]:
    """The ranks that hang by their peers' account: every waiting rank's collective failed on a peer (the
    backend's timeout, a closed connection) while these, alive, neither step nor wait for ``grace_s``. Seen when
    the backend times out before the supervisor's own hang timeout (gloo's, during the learned timeouts' warm-up):
    these are then the hung ranks, killed alone like any hang's. () otherwise."""
    waiting = [r for r in ranks if r.alive and r.awaiting]
    stuck = tuple(sorted(r.rank for r in ranks if r.alive and not r.awaiting))
    if not waiting or not stuck or stuck_s < grace_s or not all(r.peer_failed for r in waiting):
        return ()
    return stuck


SHOW_UP_S = 60.0  # the least a rank started again gets to show up in its slot (srun, interpreter, imports)
SHOW_UP_STARTUPS = 2.0  # ... or this many times the launch's own start-up, when that was longer


def show_up_deadline_s(startup_s: float | None) -> float | None:
    """How long a rank a warm restart started again (a new step, or a standby given its assignment) may take to
    show up in its slot before the restart is given up: ``SHOW_UP_STARTUPS`` times the launch's own start-up (from
    its srun to its first step: a new process does what every rank did then), at least ``SHOW_UP_S``. None while
    the launch never stepped: its start-up is unknown and nothing is given up on missing data."""
    if startup_s is None:
        return None
    return max(SHOW_UP_S, SHOW_UP_STARTUPS * max(0.0, startup_s))


def missing_replacements(started: Iterable[tuple[int, float]], shown: Iterable[int], now: float,
                         deadline_s: float | None) -> tuple[int, ...]:  # fmt: skip
    """The ranks started again (``started``: rank, when) that have not shown up (``shown``: ranks with a live
    slot in the launch) within ``deadline_s``. WHY: the kept ranks wait for them in the new rendezvous, which only
    the backend's own timeout ends (gloo's store 2 minutes here; NCCL's 10 minutes and more at scale): a
    replacement that never comes (a standby that cannot take its assignment, a step that never starts its
    program) is a second fault during the restart, answered cold instead of a wedged job."""
    if deadline_s is None:
        return ()
    seen = set(shown)
    return tuple(sorted({rank for rank, t in started if rank not in seen and now - t >= deadline_s}))


NOT_WARM_CLASSES = frozenset({ev.NUMERICAL})


def applies(decision: policy.Decision, interruption_class: str, running: Sequence[str]) -> bool:
    """Whether ``decision`` is a restart in the allocation a warm restart can carry out (see the module text) for a
    launch on ``running``: not a roll back, and every node of the launch it leaves out has a node of the decision's
    to move its ranks to (:func:`placement_after`). The policy's ``exclude`` also lists the nodes left out long
    before (the ledger's): those move no rank."""
    kinds = {a.kind for a in decision.actions}
    if policy.RESTART_IN_ALLOCATION not in kinds or kinds & {policy.STOP_STEP, policy.CHECKPOINT_NOW, policy.DRAIN}:
        return False
    if any(a.params.get("rollback") for a in decision.actions):
        return False  # a roll back: no rank died, nothing makes the ranks wait
    return interruption_class not in NOT_WARM_CLASSES and placement_after(decision, running) is not None


def placement_after(decision: policy.Decision, running: Sequence[str]) -> tuple[str, ...] | None:
    """The launch's nodes in rank order after ``decision``'s restart in the allocation: ``running`` with each node
    it leaves out (excluded, or missing from its ``nodes``) replaced by a node of the decision's it does not run on
    yet (in the decision's order: a spare), the other nodes keeping their ranks. None when the world would shrink (``fewer_nodes``, or too few spares) or
    the decision is not such a restart."""
    for action in decision.actions:
        if action.kind not in (policy.RESTART_IN_ALLOCATION, policy.WARM_RESTART):
            continue
        if action.params.get("fewer_nodes"):
            return None
        usable = list(action.params.get("nodes") or ())
        offered, on = set(usable), set(running)  # (sets: a 16k-node allocation is decided thousands of times)
        # left out: what the decision excludes, and a node of the launch it no longer offers (our own verdict found
        # it lost: the policy was never given it, so it is in no exclude list)
        out = set(action.params.get("exclude") or ()) | (on - offered if usable else set())
        if not out & on:
            return tuple(running)
        spares = iter([n for n in usable if n not in on and n not in out])
        moved = [next(spares, None) if n in out else n for n in running]
        return None if None in moved else tuple(n for n in moved if n is not None)
    return None


def hung_ranks(interruption_class: str, detections: Iterable[DetectionEvent]) -> tuple[int, ...] | None:
    """The ranks to kill alone before a warm restart: none unless the class is a hang; for a hang, the ranks the
    detections name stopped or silent (None: no rank is named, as when everyone stalled: no warm restart)."""
    if interruption_class != ev.HANG:
        return ()
    named = sorted({r for d in detections if d.kind in (RANK_HANG, RANK_STOPPED) for r in d.ranks})
    return tuple(named) or None


def as_warm(decision: policy.Decision, kill: Sequence[int] = ()) -> policy.Decision:
    """``decision`` carried out warm: the step is not killed, only the ranks in ``kill`` (``kill_ranks``), and
    ``warm_restart`` stands where the relaunch was (the loop then asks :func:`choose`)."""
    actions: list[policy.Action] = []
    for action in decision.actions:
        if action.kind == policy.KILL_STEP:
            if kill:
                actions.append(replace(action, kind=policy.KILL_RANKS, target=tuple(str(r) for r in kill)))
            continue
        if action.kind == policy.RESTART_IN_ALLOCATION:
            action = replace(action, kind=policy.WARM_RESTART, reason="restart in the ranks' processes")
        actions.append(action)
    return policy.Decision(tuple(actions), decision.state, decision.message)

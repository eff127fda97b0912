"""Where the next launch runs: which nodes of the allocation, in which rank order. Pure.

The rules the supervision loop applies between launches, apart from the loop so they can be tested alone:

* the allocation's suspects (the campaign's node ledger) are left out of the first launch when enough nodes
  remain (:func:`ledger_exclusions`);
* a relaunch keeps the exclusions the policy chose for it (:func:`exclusions_of`) plus the nodes our own verdict
  found lost;
* after an application error that kept to one node and blamed nobody, the ranks move by one node
  (:func:`rank_shift_after`): a second crash there from other ranks blames the node, one that follows the ranks
  elsewhere is the program's (``classify.repeated_on_one_node``);
* the training's nodes in rank order (:func:`step_nodes`).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.decisions import policy


@dataclass(frozen=True)
class TrainingLayout:
    """How the training step is laid out in the allocation."""

    nodes: tuple[str, ...]  # allocation nodes, in Slurm order
    tasks_per_node: int
    spare_nodes: int = 0  # nodes kept out of the training step, to replace a blamed node without requeueing

    @property
    def train_nodes(self) -> int:
        return len(self.nodes) - self.spare_nodes


def step_nodes(layout: TrainingLayout, exclude: Sequence[str] = (), shift: int = 0) -> tuple[str, ...]:
    """The training step's nodes in rank order: the first usable ones (``exclude`` left out), rotated left by
    ``shift`` so that different ranks land on each node (task ``i`` on node ``i // tasks_per_node``)."""
    usable = [n for n in layout.nodes if n not in set(exclude)][: layout.train_nodes]
    k = shift % len(usable) if usable else 0
    return tuple(usable[k:] + usable[:k])


def moved(layout: TrainingLayout, nodes: Sequence[str]) -> bool:
    """Whether ``nodes`` (rank order) differs from Slurm's own order of the same nodes: rank 0 is then not on the
    step's first node, and the tasks must be placed by a hostfile."""
    chosen = set(nodes)
    return tuple(nodes) != tuple(n for n in layout.nodes if n in chosen)


def ledger_exclusions(layout: TrainingLayout, suspects: Collection[str]) -> tuple[str, ...]:
    """The ledger's suspects that this allocation holds, left out when enough nodes remain for the training;
    none when leaving them all out would leave too few (the policy decides what to do about them then)."""
    here = tuple(n for n in layout.nodes if n in suspects)
    return here if len(layout.nodes) - len(here) >= layout.train_nodes else ()


def without_doubtful(layout: TrainingLayout, out: Collection[str], doubtful: Collection[str]) -> tuple[str, ...]:
    """``out`` and the ``doubtful`` nodes (quiet, their loss not yet judged) when the training still has enough
    nodes without them: a relaunch placed on a node that went silent with the one just found lost (a switch, a
    rack) would fail and cost a relaunch more. Nobody is blamed; a later relaunch may use them again."""
    both = set(out) | set(doubtful)
    if not set(doubtful) - set(out) or len([n for n in layout.nodes if n not in both]) < layout.train_nodes:
        return tuple(sorted(out))
    return tuple(sorted(both))


def exclusions_of(decision: policy.Decision) -> tuple[str, ...]:
    """The nodes the policy's relaunch in the allocation leaves out (none when it decided something else)."""
    for action in decision.actions:
        if action.kind in (policy.RESTART_IN_ALLOCATION, policy.WARM_RESTART):  # (the same, carried out warm)
            return tuple(action.params.get("exclude", ()))
    return ()


def rank_shift_after(interruption: cl.Interruption) -> int:
    """By how many nodes the ranks move for the next launch: one after an application error that kept to one
    node and blamed nobody (its repeat from other ranks on that node then blames the node), else none."""
    kept_to_one = len(interruption.origin_nodes) == 1 and not interruption.blamed_nodes
    return 1 if interruption.cls == ev.APP_ERROR and kept_to_one else 0


def usable_nodes(layout: TrainingLayout, lost: Collection[str]) -> tuple[str, ...]:
    """The allocation's nodes without those our own verdict found lost in this attempt."""
    return tuple(n for n in layout.nodes if n not in lost)

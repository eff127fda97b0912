"""Which in-memory snapshot a relaunch resumes from, if any. Pure.

The memory tier (issue 27) keeps each rank's newest snapshots in node-local memory, on its own node and on a
buddy node. At a relaunch the node agents say what they hold (``Held``: a step, a rank, the world size it was
taken at, the digest its writer recorded, and whether the agent re-read it and found that digest). A snapshot of
step N can be resumed from only when *every* rank of that world has, on some node that is still usable, a copy
whose content was verified and whose digest agrees with every other verified copy of that rank's shard; a
partial step never is, whatever else exists. The shards of one step must come from one launch (``Held.launch``):
a relaunch that resumed from an older step writes that step number again, and a shard the dead launch wrote
beside one of the new launch's would mix two trainings. It must be newer than the newest valid filesystem
checkpoint (the filesystem tier is then as new, and needs no transfers) and, after a NaN/Inf loss, no newer than
the last step seen with a finite loss (``not_after``: a later snapshot may hold the diverged weights). Among the candidates the newest step wins; each
rank's copy is taken from the node it will run on when that node holds one, else from the first other holder in
name order (a buddy), so the transfers are the fewest; a snapshot flushed to the shared filesystem before the job
stopped is a holder every node reads (``shared``), used when no node's memory has the shard.

Anything else — nothing complete, a world size that differs from the relaunch's (the shards are per rank), copies
that disagree — means the filesystem tier, as before the memory tier existed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Held:
    """One rank's snapshot shard as a node agent reports it."""

    step: int
    rank: int
    world: int
    digest: str  # what the writer recorded (sha256 of the shard's bytes)
    verified: bool  # the agent re-read the bytes and got ``digest``
    launch: str = ""  # the launch that wrote it (``SUPERVISOR_LAUNCH``): one step's shards must share it


@dataclass(frozen=True)
class Pick:
    step: int
    launch: str  # the launch whose snapshot it is
    sources: Mapping[int, str]  # rank -> the node to read its shard from
    fetches: int  # ranks whose shard is not on the node they will run on (copied before they start; in the
    # journal, after the copies: how many were made)
    why: str  # one line for the journal and the report


def pick(held: Mapping[str, Iterable[Held]], *, world: int, usable: Iterable[str], placement: Mapping[int, str],
         newest_filesystem_step: int | None, not_after: int | None = None,
         shared: frozenset[str] = frozenset()) -> tuple[Pick | None, str]:  # fmt: skip
    """(the snapshot to resume from, or None; why). ``held``: node -> what its agent holds; ``usable``: the
    nodes that may serve (alive, not blamed); ``placement``: rank -> the node it will run on;
    ``newest_filesystem_step``: the newest valid filesystem checkpoint's step (None: none); ``not_after``: the
    newest step allowed (None: any); ``shared``: holders every rank reads directly (a snapshot flushed to the
    shared filesystem): a shard there needs no copy, but a node's memory is preferred to it."""
    alive = set(usable)
    Key = tuple[int, str]  # (step, launch)
    copies: dict[Key, dict[int, dict[str, str]]] = {}  # -> rank -> node -> digest (verified, right world)
    conflicted: set[tuple[Key, int]] = set()
    for node in sorted(alive):
        for h in held.get(node, ()):
            if h.world != world or not h.verified or not 0 <= h.rank < world:
                continue
            if not_after is not None and h.step > not_after:
                continue
            by_node = copies.setdefault((h.step, h.launch), {}).setdefault(h.rank, {})
            if any(d != h.digest for d in by_node.values()):
                conflicted.add(((h.step, h.launch), h.rank))
            by_node[node] = h.digest
    floor = newest_filesystem_step if newest_filesystem_step is not None else -1
    complete = [k for k, ranks in copies.items()
                if k[0] > floor and len(ranks) == world and not any((k, r) in conflicted for r in ranks)]  # fmt: skip
    if not complete:
        newest = max(copies, default=None)
        if newest is None:
            limit = f" up to step {not_after}" if not_after is not None else ""
            return None, f"no verified snapshot of this world size{limit} on a usable node"
        if newest[0] <= floor:
            return None, (f"the newest snapshot (step {newest[0]}) is not newer than the filesystem checkpoint "
                          f"(step {floor})")  # fmt: skip
        have = len(copies[newest]) - sum(1 for r in copies[newest] if (newest, r) in conflicted)
        return None, f"no complete snapshot: step {newest[0]} has {have} of {world} ranks' shards on usable nodes"
    # The newest step; of two launches' complete copies of it (rare), the one with more shards at home.
    def at_home(k: Key) -> int:
        return sum(1 for r, nodes in copies[k].items() if placement.get(r) in nodes)

    key = max(complete, key=lambda k: (k[0], at_home(k), k[1]))
    sources: dict[int, str] = {}
    for rank, nodes in copies[key].items():
        home = placement.get(rank)
        sources[rank] = home if home in nodes else sorted(nodes, key=lambda n: (n in shared, n))[0]
    fetches = sum(1 for rank, node in sources.items() if placement.get(rank) != node and node not in shared)
    flushed = sum(1 for node in sources.values() if node in shared)
    where = f"{flushed} shard(s) read from the flushed copy, " if flushed else ""
    chosen = Pick(key[0], key[1], sources, fetches,
                  f"snapshot of step {key[0]} complete in memory ({where}{fetches} shard(s) copied from a buddy)")
    return chosen, chosen.why


def without_diverged(held: Iterable[Held], diverged: Mapping[str, int]) -> list[Held]:
    """``held`` less the snapshots that may hold diverged weights: ``diverged`` maps a launch that met a NaN/Inf
    loss to the last step it was seen with a finite one; that launch's later snapshots are never resumed from."""
    return [h for h in held if h.launch not in diverged or h.step <= diverged[h.launch]]

"""Standby ranks: how many pre-started processes each node of a warm launch keeps, when to start them, and which
one takes over a dead rank.

WHY: a warm restart keeps the survivors' processes, but the rank started again pays srun, Python and ``import
torch`` while its peers wait for it (about three seconds here; minutes at scale with containers). A standby
(``python -m supervisor.client.standby``) has paid that before the fault and only waits for an assignment. It
costs a process's memory (torch imported, no device context: it has not run the program yet) on each node, so:

- how many per node (:func:`per_node`): ``[run] standbys`` "auto" is as many as go together when one rank dies:
  one for a warm launch of a plain Python command, a node's workers under ``srun torchrun`` (a dead worker's
  torchrun stops its node-mates: they are all started again, and one standby alone would leave the others paying
  the start); none for what a standby cannot run (a shell wrapper, torchrun's ``--no-python``); "off" or 0 none;
  N each node's N;
- where (:func:`wanted`): ``per_node`` on each node of the launch, and on each spare node enough for a whole node's
  ranks (a lost node's ranks move there);
- when (:func:`to_start`): only once every rank of the launch's current generation trains, so that a standby's
  imports never slow the launch's own start, and again after one was taken (the pool is topped up);
- which (:func:`assign`): a dead rank goes to an idle standby on its own node (its device, its local memory
  snapshot), the oldest first; ranks without one are started again as new steps, as without standbys.

Pure: no I/O; tested in tests/unit/test_standbys.py.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

AUTO_PER_NODE = 1
STANDBY_VALUES = ("auto", "off")


def per_node(setting: str | int, *, warm: bool, plain_python: bool, together: int = 1) -> int:
    """Standbys each node of the launch keeps: 0 for a cold launch (nothing would take them) or a command a
    standby cannot run (not ``python SCRIPT``/``python -m MODULE``, or torchrun's worker of one); "auto":
    ``together``, the ranks a node starts again at once when one of them dies (1; a torchrun's workers)."""
    if not warm or not plain_python or setting == "off":
        return 0
    if setting == "auto":
        return max(AUTO_PER_NODE, together)
    return max(0, int(setting))


def wanted(nodes: Sequence[str], spares: Sequence[str], *, per_node: int, tasks_per_node: int) -> dict[str, int]:
    """How many standbys each node keeps: ``per_node`` on the launch's ``nodes``; on a spare node (of the
    allocation, usable, not in the launch) enough to take over a whole lost node's ranks (``tasks_per_node``, at
    least ``per_node``), so that a node's loss costs no srun either. None anywhere when ``per_node`` is 0."""
    if per_node <= 0:
        return {}
    out = dict.fromkeys(nodes, per_node)
    out.update({n: max(per_node, tasks_per_node) for n in spares if n not in out})
    return out


def to_start(want: Mapping[str, int], idle: Mapping[str, int], *, training: bool) -> list[str]:
    """The nodes to start one more standby on (a node as often as it lacks one), in ``want``'s order; none while
    the launch is not training yet. ``idle``: live unassigned standbys by node (started or starting)."""
    if not training:
        return []
    return [node for node, n in want.items() for _ in range(max(0, n - idle.get(node, 0)))]


def assign(dead: Mapping[int, str], idle: Mapping[str, Sequence[str]]) -> dict[int, str]:
    """Which idle standby takes over which dead rank (rank -> standby id): on the rank's node, in ``idle``'s order
    (oldest first), each standby once. Ranks missing from the answer are started again as new steps."""
    used: Counter[str] = Counter()
    out: dict[int, str] = {}
    for rank, node in sorted(dead.items()):
        pool = idle.get(node, ())
        if used[node] < len(pool):
            out[rank] = pool[used[node]]
            used[node] += 1
    return out

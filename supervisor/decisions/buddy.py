"""Which node keeps a copy of which node's memory snapshots (the memory tier's buddy ring). Pure.

Each node's new shards go to the next node of a ring over the usable nodes, so every node holds exactly one
other node's copies (memory per node: its own state and one buddy's, about 2x). A node and its buddy should not
fail together: when the switch of each node is known (Slurm's topology), the ring is ordered so that neighbours
sit on different switches whenever no switch holds more than half the nodes (its nodes then take every other
place). Without a topology the order is by name, which is stable across the supervisor's restarts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


def ring(nodes: Sequence[str], switch_of: Mapping[str, str] | None = None) -> dict[str, str]:
    """node -> the node its shards are copied to (empty with fewer than two nodes)."""
    names = sorted(set(nodes))
    if len(names) < 2:
        return {}
    if switch_of:
        groups: dict[str, list[str]] = {}
        for n in names:
            groups.setdefault(switch_of.get(n, ""), []).append(n)
        ordered = [n for _, members in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])) for n in members]
        slots: list[str] = [""] * len(names)
        places = list(range(0, len(names), 2)) + list(range(1, len(names), 2))
        for place, name in zip(places, ordered, strict=True):
            slots[place] = name
        names = slots
    return {n: names[(i + 1) % len(names)] for i, n in enumerate(names)}

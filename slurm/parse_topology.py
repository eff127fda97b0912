"""Parsing ``scontrol show topology``: which switch (or block) each node hangs off, for the memory tier's buddy
ring (a node and the node holding its copies should not share a leaf switch: ``decisions.buddy``).

topology/tree prints one line per switch, ``SwitchName=s0 Level=0 LinkSpeed=1 Nodes=node[1-2]`` (upper levels add
``Switches=...``); topology/block (Slurm 23.11+) prints ``BlockName=b1 BlockIndex=0 Nodes=...``. A node's group is
the lowest-level switch, or the block, that lists it. No topology plugin: no lines (or a message), no groups.
Raises only :class:`slurm.parse.ParseError`.
"""

from __future__ import annotations

from slurm.hostlist import HostlistError, expand
from slurm.parse import ParseError
from slurm.parse_scontrol import parse_key_values


def parse_topology(output: str) -> dict[str, str]:
    """node -> its leaf switch's (or block's) name; empty when Slurm has no topology."""
    if not isinstance(output, str):
        raise ParseError("scontrol show topology output is not text")
    best: dict[str, tuple[int, str]] = {}
    for line in output.splitlines():
        if "=" not in line or not line.lstrip().startswith(("SwitchName=", "BlockName=")):
            continue  # "No topology information available" and the like
        fields = parse_key_values(line)
        name = fields.get("SwitchName") or fields.get("BlockName") or ""
        level_text = fields.get("Level", "0")
        if not name or not level_text.isdigit():
            raise ParseError(f"a line of `scontrol show topology` has no name or a bad level: {line[:200]!r}")
        nodes = fields.get("Nodes", "")
        if not nodes:
            continue
        try:
            members = expand(nodes)
        except HostlistError as err:
            raise ParseError(f"switch {name}: Nodes={nodes[:200]!r} is not a hostlist ({err})") from None
        level = int(level_text)
        for node in members:
            if node not in best or level < best[node][0]:
                best[node] = (level, name)
    return {node: name for node, (_, name) in best.items()}

"""Training-step log lines attributed to the task (rank) and node that wrote them. Pure.

The supervisor launches the training step with ``srun --label``: srun prefixes every line a task writes with
its task id, right-aligned to the width of the largest id (`` 3: text`` with 16 tasks). With the step's task
layout (block distribution: tasks ``0..k-1`` on the first node, ``k..2k-1`` on the second, ...; ``k`` tasks per
node) the task id names the node, so a hardware line blames the machine it came from instead of nobody.

Whoever reads the program's own output from the launch log (``step=N loss=X`` lines) strips the label first:
:func:`strip_label`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_LABEL = re.compile(r"^\s*(\d+): ")  # srun --label
_TORCH_RANK = re.compile(r"^\s*\[rank(\d+)\]:\s?")  # torch.distributed's own "[rank3]: ..." prefix


@dataclass(frozen=True)
class LogLine:
    """One line of the training step's output; ``node``/``rank`` are None when not known."""

    text: str
    node: str | None = None
    rank: int | None = None


def split_label(line: str) -> tuple[int | None, str]:
    """``" 3: text"`` -> ``(3, "text")``; a line without srun's label -> ``(None, line)``."""
    m = _LABEL.match(line)
    if m is None:
        return None, line
    return int(m.group(1)), line[m.end() :]


def strip_label(line: str) -> str:
    """The program's own text of a labelled line (unchanged when there is no label)."""
    return split_label(line)[1]


def rank_of(line: str) -> tuple[int | None, str]:
    """The writer's rank from srun's label, else from torch's ``[rankN]:`` prefix, and the text without them."""
    task, text = split_label(line)
    m = _TORCH_RANK.match(text)
    if m is not None:
        return (task if task is not None else int(m.group(1))), text[m.end() :]
    return task, text


def task_nodes(nodes: Sequence[str], tasks_per_node: int, ntasks: int | None = None) -> tuple[str, ...]:
    """The node of each task id of a step laid out in blocks: ``tasks_per_node`` consecutive ids per node, in
    the order of ``nodes`` (the step's node list as Slurm orders it). ``ntasks`` defaults to all slots."""
    if tasks_per_node < 1:
        raise ValueError(f"tasks_per_node must be >= 1, got {tasks_per_node!r}")
    total = len(nodes) * tasks_per_node if ntasks is None else min(ntasks, len(nodes) * tasks_per_node)
    return tuple(nodes[task // tasks_per_node] for task in range(max(0, total)))


def attribute(lines: Iterable[str], nodes_of_tasks: Sequence[str] = ()) -> tuple[LogLine, ...]:
    """Labelled log lines -> :class:`LogLine` with rank and node (node None when the task id is out of range
    or the line carries no label). The text keeps the label off."""
    out = []
    for line in lines:
        rank = rank_of(line)[0]
        text = strip_label(line)
        node = nodes_of_tasks[rank] if rank is not None and 0 <= rank < len(nodes_of_tasks) else None
        out.append(LogLine(text, node, rank))
    return tuple(out)

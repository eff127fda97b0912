"""Training-step log lines attributed to the task (rank) and node that wrote them. Pure.

The supervisor launches the training step with ``srun --label``: srun prefixes every line a task writes with
its task id, right-aligned to the width of the largest id (`` 3: text`` with 16 tasks). With the step's task
layout (block distribution: tasks ``0..k-1`` on the first node, ``k..2k-1`` on the second, ...; ``k`` tasks per
node) the task id names the node, so a hardware line blames the machine it came from instead of nobody.

A communication error often names its remote end by address or host name: :func:`named_peers` maps those
names back to nodes (:func:`address_book`).

Whoever reads the program's own output from the launch log (``step=N loss=X`` lines) strips the label first:
:func:`strip_label`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
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
    """The writer's rank from torch's ``[rankN]:`` prefix, else from srun's label, and the text without them.
    (They agree under plain srun; under ``srun torchrun`` the label is the node's torchrun task.)"""
    task, text = split_label(line)
    m = _TORCH_RANK.match(text)
    if m is not None:
        return int(m.group(1)), text[m.end() :]
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
        task = split_label(line)[0]
        rank = rank_of(line)[0]
        where = task if task is not None else rank
        text = strip_label(line)
        node = nodes_of_tasks[where] if where is not None and 0 <= where < len(nodes_of_tasks) else None
        out.append(LogLine(text, node, rank))
    return tuple(out)


_TOKEN = re.compile(r"[A-Za-z0-9][\w.\-]*")
_NCCL_WRITER = re.compile(r"^\s*([\w.\-]+):\d+:\d+ ")  # NCCL's "host:pid:tid [dev] NCCL WARN ..." names the writer


def address_book(nodes: Iterable[str], node_addresses: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every name a log line may use for a node -> the node: its Slurm name, short host name, address. An address
    several nodes share (several slurmd on one host) or a loopback address names nobody."""
    node_addresses = node_addresses or {}
    names = (*nodes, *node_addresses)
    book: dict[str, str] = dict(zip(names, names, strict=True))  # a full name always names its node
    if "." in "".join(names):  # short host names (a 16k-node book without them is C-level, ~1 ms)
        for node in names:
            book.setdefault(node.split(".")[0], node)
    owners: dict[str, set[str]] = {}
    for node, address in node_addresses.items():
        owners.setdefault(address, set()).add(node)
    for address, owned_by in owners.items():
        if len(owned_by) == 1 and not address.startswith(("127.", "localhost", "::1")) and address not in book:
            book[address] = next(iter(owned_by))
    return book


def named_peers(text: str, book: Mapping[str, str], own: str | None) -> tuple[str, ...]:
    """Nodes a communication error names as its remote end (gloo "closed by peer [10.0.0.2]:1234", NCCL
    "remote peer node2<4567>"); the writer's own node (``own``, or NCCL's ``host:pid:tid`` prefix) is never it."""
    m = _NCCL_WRITER.match(text)
    if m is not None:
        own = own or book.get(m.group(1)) or book.get(m.group(1).split(".")[0])
        text = text[m.end() :]
    named = set()
    for token in _TOKEN.findall(text):
        token = token.rstrip(".-")
        node = book.get(token) or (book.get(token.split(".")[0]) if not token[:1].isdigit() else None)
        if node and node != own:
            named.add(node)
    return tuple(sorted(named))


# srun's own report of how tasks ended (src/srun/launch: "srun: error: NODE: task(s) LIST: WHAT"): the only
# place that names a rank killed from outside (its agent cannot read a non-child's exit status).
_SRUN_TASK = re.compile(r"^srun: error: (?P<node>[\w.\-]+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+)$")
MAX_TASKS = 1 << 20  # more task ids than this in one line is not srun's (a hostile line must not build a huge list)
_EXIT_CODE = re.compile(r"Exited with exit code (\d+)")
# strsignal(3) texts srun prints for a task killed by a signal
_SIGNAL_TEXTS = {"Hangup": 1, "Interrupt": 2, "Quit": 3, "Illegal instruction": 4, "Trace/breakpoint trap": 5,
                 "Aborted": 6, "Bus error": 7, "Floating point exception": 8, "Killed": 9,
                 "User defined signal 1": 10, "Segmentation fault": 11, "User defined signal 2": 12,
                 "Broken pipe": 13, "Alarm clock": 14, "Terminated": 15}  # fmt: skip


@dataclass(frozen=True)
class TaskExit:
    """One task's ending as srun reported it: an exit code or a signal number (one of the two is set)."""

    node: str
    task: int
    exit_code: int | None = None
    signal: int | None = None
    order: int = 0  # position among srun's reports: the first one is usually the cause, later ones its effects


def _task_ids(text: str) -> list[int]:
    """``0-3,7`` -> [0, 1, 2, 3, 7]; nothing when the list names more than ``MAX_TASKS`` tasks."""
    ranges: list[range] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()) and len(lo) <= 9 and len(hi) <= 9:
            ranges.append(range(int(lo), int(hi or lo) + 1))
    if sum(len(r) for r in ranges) > MAX_TASKS:
        return []
    return [task for r in ranges for task in r]


def srun_task_exits(lines: Iterable[str]) -> tuple[TaskExit, ...]:
    """srun's ``srun: error: node2: task 1: Killed`` / ``tasks 0-3: Exited with exit code 1`` lines -> one
    :class:`TaskExit` per task, in the order srun printed them (a task reported twice keeps its first)."""
    out: dict[int, TaskExit] = {}
    for line in lines:
        m = _SRUN_TASK.match(line.strip())
        if m is None:
            continue
        what = m.group("what").strip()
        code = _EXIT_CODE.search(what)
        sig = _SIGNAL_TEXTS.get(what.removesuffix(" (core dumped)").strip())
        if code is None and sig is None:
            continue
        for task in _task_ids(m.group("tasks")):
            if task not in out:
                out[task] = TaskExit(m.group("node"), task, int(code.group(1)) if code else None, sig, len(out))
    return tuple(out.values())


# torchrun's own report when a worker fails (torch.distributed.elastic's ChildFailedError), printed by the
# torchrun that is srun's task on that node: "  rank      : 3 (local_rank: 1)" then "  exitcode  : -9 (pid: 123)".
_ELASTIC_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*$")
_ELASTIC_CODE = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*\d+\)")  # may end in " (SIGKILL)"
_ELASTIC_ROOT = re.compile(r"^\s*Root Cause \(first observed failure\):")


@dataclass(frozen=True)
class WorkerExit:
    """A torchrun worker's ending as its torchrun reported it: ``task`` is srun's task (that node's torchrun),
    ``rank`` the worker's global rank; ``exit_code`` as Python's returncode (minus the signal when killed)."""

    task: int
    rank: int
    exit_code: int


_CHILD_FAILED = re.compile(r"^(?:torch\.distributed\.elastic\.multiprocessing\.errors\.)?ChildFailedError:?")
_TRACEBACK = re.compile(r"^Traceback \(most recent call last\)")
_EXCEPTION_LINE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception|Exit|Interrupt)(?::|$)")


def torchrun_wrapper_lines(lines: Sequence[str]) -> set[int]:
    """Indexes of torchrun's own traceback lines: its ``ChildFailedError`` and the ``Traceback`` line that opened
    it (the same srun task's last one before it, with no other exception line between). torchrun raises it because
    a worker failed, and prints the worker's ending below it (``torchrun_worker_exits``): a consequence, never the
    program's error. A worker's own traceback (through torchrun, under the same task) ends in its own exception."""
    out: set[int] = set()
    opened: dict[int | None, int] = {}  # srun task -> its last Traceback line not yet closed by an exception
    for i, line in enumerate(lines):
        task, text = split_label(line)
        text = text.strip()
        if _TRACEBACK.match(text):
            opened[task] = i
        elif _CHILD_FAILED.match(text):
            out.add(i)
            if task in opened:
                out.add(opened.pop(task))
        elif _EXCEPTION_LINE.match(text):
            opened.pop(task, None)
    return out


def torchrun_worker_exits(lines: Iterable[str]) -> tuple[WorkerExit, ...]:
    """Failed workers from torchrun's failure summaries, one per rank: each torchrun's root cause first (it
    prints "Failures:" before "Root Cause (first observed failure):"), then the others."""
    out: dict[int, tuple[bool, WorkerExit]] = {}
    pending: dict[int | None, int] = {}  # srun task -> rank named, its exitcode line next
    in_root: set[int | None] = set()  # tasks whose summary is in its root-cause section
    for line in lines:
        task, text = split_label(line)
        if _ELASTIC_ROOT.match(text):
            in_root.add(task)
            continue
        m = _ELASTIC_RANK.match(text)
        if m is not None:
            pending[task] = int(m.group(1))
            continue
        c = _ELASTIC_CODE.match(text)
        if c is not None and task in pending:
            rank = pending.pop(task)
            if task is not None and (rank not in out or (task in in_root and not out[rank][0])):
                out[rank] = (task in in_root, WorkerExit(task, rank, int(c.group(1))))
    ordered = sorted(out.values(), key=lambda e: not e[0])  # stable: root causes first, in log order
    return tuple(w for _, w in ordered)


# torchrun's error line each time a worker group of its node fails (torch.distributed.elastic.multiprocessing):
# "E1203 08:04:14.767000 20095 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9)
# local_rank: 1 (pid: 20188) of binary: /venv/bin/python3". With --max-restarts > 0 torchrun then restarts the
# group if it has restarts left; after its last one it gives up and prints its failure summary (Root Cause).
_ELASTIC_GROUP_FAILED = re.compile(r"\] failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\) of (?:binary|fn)")


def torchrun_restarts(lines: Iterable[str]) -> dict[int, int]:
    """srun task (a node's torchrun) -> how many times that torchrun restarted its workers after a failure:
    its group failures, less the last one when it then gave up (printed its failure summary). Restarts for a
    peer's membership change are not failures (torchrun does not count them either) and are not logged."""
    failures: dict[int, int] = {}
    gave_up: set[int] = set()
    for line in lines:
        task, text = split_label(line)
        if task is None:
            continue
        if _ELASTIC_GROUP_FAILED.search(text):
            failures[task] = failures.get(task, 0) + 1
        elif _ELASTIC_ROOT.match(text) and failures.get(task):
            gave_up.add(task)
    out = {task: n - (task in gave_up) for task, n in failures.items()}
    return {task: n for task, n in sorted(out.items()) if n > 0}

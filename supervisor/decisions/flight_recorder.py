"""PyTorch's flight recorder dumps: which rank a collective waits for. Pure.

Why: when a collective times out, every rank's process group has a record of the collectives it enqueued, started
and completed (``TORCH_NCCL_TRACE_BUFFER_SIZE`` / ``TORCH_FR_BUFFER_SIZE``; written on timeout with
``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` to ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>``, or by torch's dump functions). In a
global stall the ranks that reached the next collective have enqueued one more than the rank they wait for, and
are inside it (enqueued, not completed); the rank they wait for completed everything it enqueued and is somewhere
else. That rank is named, as a stack comparison names it (``decisions/stall.py``), but without asking the stuck
process for anything.

The dumps are written by the program's processes: untrusted input. Torch writes JSON or a pickle; a pickle is never
unpickled here: its opcode stream (``pickletools.genops``) is read by a small machine that builds only dicts,
lists, tuples, strings, numbers, booleans and None, and refuses every opcode that would import or call anything.
Every failure is a :class:`FlightRecorderError`.
"""

from __future__ import annotations

import json
import pickletools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_DUMP_BYTES = 64 << 20  # the trace buffer's default is 2,000 entries: a few MB
MAX_OBJECTS = 2_000_000
_MARK = object()


class FlightRecorderError(ValueError):
    """A dump that cannot be read as a flight recorder's (what is wrong with it, in one line)."""


@dataclass(frozen=True)
class GroupStatus:
    """One process group as one rank saw it: the sequence numbers of its last collectives."""

    enqueued: int
    completed: int
    desc: str = ""


@dataclass(frozen=True)
class Dump:
    groups: Mapping[str, GroupStatus]  # pg id -> its status on this rank


@dataclass(frozen=True)
class Lag:
    """Ranks the others wait for, with one evidence line each."""

    ranks: tuple[int, ...]
    evidence: tuple[str, ...]


def _pop_mark(stack: list[Any]) -> list[Any]:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1 :]
            del stack[i:]
            return items
    raise FlightRecorderError("pickle: no MARK before a collection")


_SCALARS = frozenset({"BINUNICODE", "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "BININT", "BININT1", "BININT2",
                      "LONG1", "LONG4", "BINFLOAT", "SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "INT", "LONG",
                      "FLOAT", "NONE", "NEWTRUE", "NEWFALSE"})  # fmt: skip
_CONSTANTS = {"NONE": None, "NEWTRUE": True, "NEWFALSE": False}


def data_from_pickle(data: bytes) -> Any:
    """The value a pickle of plain data describes, read from its opcodes without unpickling."""
    stack: list[Any] = []
    memo: dict[int, Any] = {}
    made = 0
    try:
        for opcode, arg, _ in pickletools.genops(data):
            op = opcode.name
            made += 1
            if made > MAX_OBJECTS:
                raise FlightRecorderError("pickle: too many objects")
            if op in ("PROTO", "FRAME"):
                continue
            if op == "STOP":
                if len(stack) != 1:
                    raise FlightRecorderError("pickle: stack not one value at STOP")
                return stack[0]
            if op in _SCALARS:
                stack.append(_CONSTANTS[op] if op in _CONSTANTS else arg)
            elif op == "MARK":
                stack.append(_MARK)
            elif op == "EMPTY_DICT":
                stack.append({})
            elif op == "EMPTY_LIST":
                stack.append([])
            elif op == "EMPTY_TUPLE":
                stack.append(())
            elif op in ("TUPLE1", "TUPLE2", "TUPLE3"):
                n = int(op[-1])
                if len(stack) < n:
                    raise FlightRecorderError("pickle: stack underflow")
                items = stack[-n:]
                del stack[-n:]
                stack.append(tuple(items))
            elif op == "TUPLE":
                stack.append(tuple(_pop_mark(stack)))
            elif op in ("APPEND", "APPENDS"):
                items = [stack.pop()] if op == "APPEND" else _pop_mark(stack)
                if not stack or not isinstance(stack[-1], list):
                    raise FlightRecorderError("pickle: APPEND to a non-list")
                stack[-1].extend(items)
            elif op in ("SETITEM", "SETITEMS"):
                items = stack[-2:] if op == "SETITEM" else _pop_mark(stack)
                if op == "SETITEM":
                    del stack[-2:]
                if not stack or not isinstance(stack[-1], dict) or len(items) % 2:
                    raise FlightRecorderError("pickle: SETITEMS to a non-dict")
                for k, v in zip(items[::2], items[1::2], strict=True):
                    if not isinstance(k, (str, int, float, bool, tuple, type(None))):
                        raise FlightRecorderError("pickle: an unhashable key")
                    stack[-1][k] = v
            elif op in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg or 0)] = stack[-1]
            elif op == "MEMOIZE":
                memo[len(memo)] = stack[-1]
            elif op in ("BINGET", "LONG_BINGET", "GET"):
                stack.append(memo[int(arg or 0)])
            else:
                raise FlightRecorderError(f"pickle: opcode {op} is not plain data (refused)")
    except FlightRecorderError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, OverflowError) as err:
        raise FlightRecorderError(f"pickle: {type(err).__name__}: {err}") from None
    raise FlightRecorderError("pickle: no STOP")


def _int(value: Any, default: int = -1) -> int:
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,18}", value.strip()):
        return int(value)
    return default


def parse_dump(data: bytes) -> Dump:
    """A rank's dump (JSON or pickle, as torch writes them) -> the status of each of its process groups."""
    if len(data) > MAX_DUMP_BYTES:
        raise FlightRecorderError(f"dump of {len(data)} bytes is over {MAX_DUMP_BYTES}")
    head = data.lstrip()[:1]
    if head == b"{":
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError) as err:
            raise FlightRecorderError(f"json: {err}") from None
    elif head == b"\x80":
        doc = data_from_pickle(data)
    else:
        raise FlightRecorderError("neither JSON nor a pickle")
    if not isinstance(doc, dict):
        raise FlightRecorderError("the dump is not a mapping")
    status, config = doc.get("pg_status"), doc.get("pg_config")
    if not isinstance(status, dict):
        raise FlightRecorderError("the dump has no pg_status")
    config = config if isinstance(config, dict) else {}
    groups = {}
    for pg, fields in status.items():
        if not isinstance(fields, dict):
            continue
        enqueued, completed = _int(fields.get("last_enqueued_collective")), _int(fields.get("last_completed_collective"))
        cfg = config.get(pg)
        desc = cfg.get("desc") if isinstance(cfg, dict) else None
        groups[str(pg)] = GroupStatus(enqueued, completed, desc[:80] if isinstance(desc, str) else "")
    return Dump(groups)


def lagging(dumps: Mapping[int, Dump]) -> Lag | None:
    """The ranks the others wait for, by process group: those behind the group's newest enqueued collective and
    inside none (they completed all they enqueued) while the others are inside it. Named only when fewer ranks
    lag than wait (a majority behind is no stall on them); None when nobody is."""
    named: dict[int, str] = {}
    groups = sorted({pg for d in dumps.values() for pg in d.groups})
    for pg in groups:
        seen = {rank: d.groups[pg] for rank, d in dumps.items() if pg in d.groups and d.groups[pg].enqueued >= 0}
        if len(seen) < 2:
            continue
        newest = max(s.enqueued for s in seen.values())
        waiting = [r for r, s in seen.items() if s.enqueued == newest and s.completed < newest]
        behind = [r for r, s in seen.items() if s.enqueued < newest and s.completed >= s.enqueued]
        if not waiting or not behind or len(behind) >= len(waiting):
            continue
        desc = next((s.desc for s in seen.values() if s.desc), "")
        group = f"process group {pg}" + (f" ({desc})" if desc else "")
        for rank in sorted(behind):
            named.setdefault(rank, f"flight recorder: in {group} ranks {_ranks(waiting)} wait inside collective "
                                   f"#{newest}; rank {rank} completed #{seen[rank].enqueued} and never enqueued "
                                   f"#{newest}")  # fmt: skip
    if not named:
        return None
    return Lag(tuple(sorted(named)), tuple(named[r] for r in sorted(named)))


def _ranks(ranks: list[int]) -> str:
    ranks = sorted(ranks)
    return ",".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")

"""Slurm hostlist expressions (``node[01-03,7],r[1-2]n[01-02]``) and the validation of names and job ids.

Every node name and job id that reaches a Slurm command line goes through ``validate_node_name`` /
``validate_job_id`` first, so a value read from the environment, a journal or a user can never smuggle an
option (``-x``) or shell syntax into an argument list.

Syntax accepted by ``expand`` (a superset of what Slurm 22.05's parser takes):
- comma-separated entries; commas inside brackets separate ranges, not hosts;
- ``prefix[ranges]`` where ranges are ``N`` or ``LO-HI`` separated by commas; the width of ``LO`` sets the
  zero padding of the whole range, like Slurm (``[01-10]`` -> 01..10, ``[1-10]`` -> 1..10, ``[1-02]`` -> 1, 2);
- several bracket groups in one name (``r[1-2]n[01-02]`` -> r1n01 r1n02 r2n01 r2n02, the first group varying
  slowest, as Slurm does) and text after a group (``gpu-a[1-2]-x``; Slurm 22.05 itself rejects a trailing
  suffix, so ``compress`` never produces one);
- nested or unbalanced brackets, empty ranges and ``HI < LO`` raise ``HostlistError``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from itertools import product

from slurm.errors import HostlistError, InvalidJobId, InvalidNodeName, SlurmUsageError

MAX_NODE_NAME_LEN = 64
"""Longest accepted node name (HOST_NAME_MAX on Linux)."""

MAX_EXPANDED_HOSTS = 1 << 20
"""Refuse expressions that expand to more hosts than this (a typo like ``n[1-999999999]`` must not eat RAM)."""

_NODE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_JOB_ID_RE = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,10})?")
_STEP_ID_RE = re.compile(r"[0-9]{1,10}(?:_[0-9]{1,10}|\+[0-9]{1,10})?\.(?:[0-9]{1,10}|batch|extern)")
_NODE_CHARS_RE = re.compile(r"[A-Za-z0-9._-]*")
_RANGE_RE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_TRAILING_DIGITS_RE = re.compile(r"^(.*?)([0-9]+)$", re.DOTALL)


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is a safe node name (letters, digits, ``.``, ``_``, ``-``; not starting with ``-``)."""
    if not isinstance(name, str) or not name:
        raise InvalidNodeName(repr(name), "a node name must be a non-empty string")
    if len(name) > MAX_NODE_NAME_LEN:
        raise InvalidNodeName(name, f"longer than {MAX_NODE_NAME_LEN} characters")
    if not _NODE_NAME_RE.fullmatch(name):
        raise InvalidNodeName(name, "only letters, digits, '.', '_' and '-' are allowed, and it must not start with '-'")
    return name


def validate_job_id(job_id: str | int) -> str:
    """Return the canonical string form of a job id: ``123``, an array task ``123_4`` or a het component ``123+1``."""
    if isinstance(job_id, bool):
        raise InvalidJobId(repr(job_id))
    if isinstance(job_id, int):
        if job_id <= 0:
            raise InvalidJobId(str(job_id))
        return str(job_id)
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id) or job_id.startswith("0"):
        raise InvalidJobId(repr(job_id))
    return job_id


def validate_step_id(step_id: str) -> str:
    """Return ``step_id`` if it is a job step such as ``123.0``, ``123.batch`` or ``123_4.1``."""
    if not isinstance(step_id, str) or not _STEP_ID_RE.fullmatch(step_id) or step_id.startswith("0"):
        raise InvalidJobId(repr(step_id))
    return step_id


def _split_top_level(expr: str) -> list[str]:
    """Split at commas outside brackets; reject nested or unbalanced brackets."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(expr):
        if ch == "[":
            if depth:
                raise HostlistError(expr, f"nested '[' at position {i}")
            depth = 1
        elif ch == "]":
            if not depth:
                raise HostlistError(expr, f"']' without '[' at position {i}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(expr[start:i])
            start = i + 1
    if depth:
        raise HostlistError(expr, "'[' is never closed")
    parts.append(expr[start:])
    return parts


def _ranges(expr: str, body: str) -> list[tuple[int, int, int]]:
    """The inside of one bracket group (``01-03,7``) as (lo, hi, width) ranges, checked but not expanded."""
    out: list[tuple[int, int, int]] = []
    for piece in body.split(","):
        m = _RANGE_RE.fullmatch(piece)
        if not m:
            raise HostlistError(expr, f"bad range {piece!r} (expected N or LO-HI with digits only)")
        lo_text, hi_text = m.group(1), m.group(2)
        if max(len(lo_text), len(hi_text or "")) > MAX_NODE_NAME_LEN:
            raise HostlistError(expr, f"range {piece[:20]!r}... has numbers longer than a node name")
        lo = int(lo_text)
        hi = int(hi_text) if hi_text is not None else lo
        if hi < lo:
            raise HostlistError(expr, f"range {piece!r} runs backwards")
        out.append((lo, hi, len(lo_text)))
    return out


def _digits(lo: int, hi: int, width: int) -> Iterator[str]:
    return (f"{n:0{width}d}" for n in range(lo, hi + 1))


Entry = tuple[list[str], list[list[tuple[int, int, int]]]]  # literals, and the bracket groups between them


def _parse_entry(expr: str, entry: str) -> tuple[Entry, int]:
    """One comma-free entry, possibly with several bracket groups (a Cartesian product), parsed and checked but
    not expanded: (its parts, how many names it yields). The names' length and characters are checked here."""
    literals: list[str] = []
    groups: list[list[tuple[int, int, int]]] = []
    pos = 0
    while True:
        open_at = entry.find("[", pos)
        if open_at < 0:
            literals.append(entry[pos:])
            break
        close_at = entry.index("]", open_at)  # balanced: checked by _split_top_level
        literals.append(entry[pos:open_at])
        groups.append(_ranges(expr, entry[open_at + 1 : close_at]))
        pos = close_at + 1
    count = 1
    for group in groups:
        count *= sum(hi - lo + 1 for lo, hi, _ in group)
    longest = sum(map(len, literals)) + sum(max(max(w, len(str(hi))) for _, hi, w in g) for g in groups)
    text = "".join(literals)
    if longest > MAX_NODE_NAME_LEN or (text and not _NODE_CHARS_RE.fullmatch(text)) or \
            (literals[0] and not literals[0][0].isalnum()):  # fmt: skip
        name = literals[0] if not groups else f"{literals[0]}{groups[0][0][0]:0{groups[0][0][2]}d}..."
        raise HostlistError(expr, f"it yields an invalid node name ({name[:70]!r}): letters, digits, '.', '_' and "
                                  f"'-', at most {MAX_NODE_NAME_LEN} characters, not starting with '-'")  # fmt: skip
    return (literals, groups), count


def _build(entry: Entry) -> Iterator[str]:
    literals, groups = entry
    pieces: list[list[str]] = [[literals[0]]]
    for group, literal in zip(groups, literals[1:], strict=True):
        pieces.append([d for lo, hi, w in group for d in _digits(lo, hi, w)])
        pieces.append([literal])
    return ("".join(combo) for combo in product(*pieces))


def expand(expr: str, limit: int = MAX_EXPANDED_HOSTS) -> list[str]:
    """Expand a hostlist expression into node names, in the written order (duplicates kept, like Slurm). Every
    entry is parsed and counted before a single name is built: more than ``limit`` names is a HostlistError that
    a hostile expression (a long prefix times a million hosts) reaches from its parse, never from its expansion."""
    if not isinstance(expr, str):
        raise HostlistError(repr(expr), "a hostlist must be a string")
    expr = expr.strip()
    if not expr:
        return []
    entries: list[Entry] = []
    total = 0
    for text in _split_top_level(expr):
        if not text:
            continue  # Slurm ignores empty entries ("a,,b")
        entry, count = _parse_entry(expr, text)
        total += count
        if total > limit:
            raise HostlistError(expr, f"expands to more than {limit} hosts")
        entries.append(entry)
    return [name for entry in entries for name in _build(entry)]


def _split_name(name: str) -> tuple[str, str]:
    """``node01`` -> (``node``, ``01``); a name without trailing digits -> (name, "")."""
    m = _TRAILING_DIGITS_RE.match(name)
    if not m:
        return name, ""
    return m.group(1), m.group(2)


def sort_key(name: str) -> tuple[str, int, int, int]:
    """Order like Slurm's sorted hostlists: by prefix, bare names first, then digit count, then number.

    For names whose numbers are all unpadded or all padded to one width this is plain numeric order
    (node9 < node10); Slurm's own comparator is not a total order for mixed padding, ours is.
    """
    prefix, digits = _split_name(name)
    if not digits:
        return (prefix, 0, 0, 0)
    return (prefix, 1, len(digits), int(digits))


def sort_unique(names: Iterable[str]) -> list[str]:
    """Validated, de-duplicated names in ``sort_key`` order."""
    return sorted({validate_node_name(n) for n in names}, key=sort_key)


def _format_run(digits: list[str]) -> str:
    """One run of consecutive numbers sharing a width -> ``07`` or ``01-03``."""
    return digits[0] if len(digits) == 1 else f"{digits[0]}-{digits[-1]}"


def compress(names: Iterable[str]) -> str:
    """Compress names into the shortest Slurm hostlist that Slurm 22.05+ accepts (sorted and de-duplicated).

    Only the trailing number of each name is bracketed (``r1n[01-02],r2n[01-02]``), exactly what Slurm's own
    parser can read back.
    """
    ordered = sort_unique(names)
    groups: list[tuple[str, list[list[str]]]] = []  # (prefix, runs of digit strings)
    for name in ordered:
        prefix, digits = _split_name(name)
        if not digits:
            groups.append((name, []))
            continue
        if groups and groups[-1][0] == prefix and groups[-1][1]:
            runs = groups[-1][1]
            last = runs[-1][-1]
            width = len(runs[-1][0])
            if int(digits) == int(last) + 1 and f"{int(digits):0{width}d}" == digits:
                runs[-1].append(digits)
            else:
                runs.append([digits])
        else:
            groups.append((prefix, [[digits]]))
    out: list[str] = []
    for prefix, runs in groups:
        if not runs:
            out.append(prefix)
        elif len(runs) == 1 and len(runs[0]) == 1:
            out.append(prefix + runs[0][0])
        else:
            out.append(prefix + "[" + ",".join(_format_run(r) for r in runs) + "]")
    return ",".join(out)


def node_hostlist(nodes: Iterable[str]) -> str:
    """Validated node names as one hostlist expression (``node[1-2]``); no nodes is a SlurmUsageError."""
    names = [validate_node_name(n) for n in nodes]
    if not names:
        raise SlurmUsageError("no nodes given", "name at least one node")
    return compress(names)

"""Pure parsers: Slurm command output (22.05 and 24.11 shapes) -> ``slurm.model`` records.

Shapes handled:
- ``squeue --json`` 22.05 (data_parser v0.0.38): ``job_state`` a string, numbers plain ints, times 0 = unset;
- ``squeue --json`` 23.02+/24.11 (v0.0.39-v0.0.42): ``job_state`` a list (base state, then flags), numbers as
  ``{"set": bool, "infinite": bool, "number": N}``, exit codes as ``{"status", "return_code", "signal"}``;
- ``sinfo --json`` 22.05 (``nodes`` array, lowercase ``state`` + ``state_flags``), 23.02+ (``sinfo`` array of
  node groups) and ``scontrol show node --json`` (``nodes`` array with a ``state`` list);
- ``scontrol show job -o`` / ``scontrol show node -o``: see ``slurm/parse_scontrol.py``;
- ``sacct``: see ``slurm/parse_sacct.py``.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from slurm.hostlist import expand, validate_job_id
from slurm.model import JOB_BASE_STATES, JOB_FLAG_PRIORITY, NODE_BASE_STATES, JobInfo, NodeInfo

_NONE_STRINGS = frozenset({"", "(null)", "None", "none", "N/A", "n/a", "Unknown", "(none)", "None assigned"})


class ParseError(ValueError):
    """Output did not have the expected shape; the adapter wraps this into ``SlurmOutputError``."""


_F = TypeVar("_F", bound=Callable[..., Any])


def typed_errors(parser: _F) -> _F:
    """Make a public parser raise only ParseError: odd output (deep JSON nesting, a bad host list or job id,
    a value of an unexpected type) must reach the adapter as "unparsable output", never as another error."""

    @functools.wraps(parser)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return parser(*args, **kwargs)
        except ParseError:
            raise
        except Exception as err:  # noqa: BLE001 - the typed-error contract of every output parser
            raise ParseError(f"unexpected output ({err.__class__.__name__}: {str(err)[:200]})") from None

    return wrapper  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------- values


def number(value: Any) -> int | None:
    """A Slurm number: plain int, digit string, or ``{set, infinite, number}``; None when unset/infinite."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        return int(text) if re.fullmatch(r"-?[0-9]+", text) else None
    if isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        return number(value.get("number"))
    return None


def timestamp(value: Any) -> int | None:
    """An epoch time; 0 / unset / infinite -> None (Slurm writes 0 for "not yet")."""
    n = number(value)
    return n if n is not None and n > 0 else None


def text(value: Any) -> str | None:
    """A Slurm string; "(null)", "None" and the like -> None."""
    if value is None:
        return None
    if isinstance(value, list):
        value = ",".join(str(v) for v in value)
    s = str(value).strip()
    return None if s in _NONE_STRINGS else s


def hostlist_field(value: Any) -> tuple[str, ...]:
    """A node-list field (hostlist string or list of names) -> expanded names."""
    if isinstance(value, list):
        names: list[str] = []
        for item in value:
            names.extend(hostlist_field(item))
        return tuple(names)
    s = text(value)
    return tuple(expand(s)) if s else ()


def scontrol_time(value: str | None) -> int | None:
    """``2026-12-02T10:50:52`` (local time, as scontrol prints it) -> epoch; Unknown/None/0 -> None."""
    s = text(value)
    if s is None:
        return None
    if re.fullmatch(r"[0-9]+", s):
        return timestamp(int(s))
    try:
        parsed = time.strptime(s, "%Y-%m-%dT%H:%M:%S")
    except ValueError:
        return None
    return int(time.mktime(parsed))


def job_state(value: Any) -> tuple[str | None, frozenset[str]]:
    """``"RUNNING"`` / ``["CANCELLED", "COMPLETING"]`` / ``"PENDING+REQUEUED"`` -> (base state, flags)."""
    if isinstance(value, str):
        tokens = [t for t in re.split(r"[+,\s]+", value.strip().upper()) if t]
    elif isinstance(value, list):
        tokens = [str(t).strip().upper() for t in value if str(t).strip()]
    else:
        tokens = []
    base = next((t for t in tokens if t in JOB_BASE_STATES), None)
    flags = frozenset(t for t in tokens if t not in JOB_BASE_STATES)
    return base, flags


def effective_job_state(base: str | None, flags: frozenset[str]) -> str:
    """The single word Slurm's text output shows: the highest-priority flag, else the base state."""
    for flag in JOB_FLAG_PRIORITY:
        if flag in flags:
            return flag
    return base or (sorted(flags)[0] if flags else "UNKNOWN")


_NODE_STATE_ALIASES = {
    "ALLOC": "ALLOCATED", "MIX": "MIXED", "IDLE": "IDLE", "DRAINED": "IDLE", "DRAINING": "ALLOCATED",
    "DRAIN": "DRAIN", "DRNG": "ALLOCATED", "COMP": "COMPLETING", "RESV": "RESERVED", "RESERVED": "RESERVED",
    "MAINT": "MAINTENANCE", "NO_RESPOND": "NOT_RESPONDING", "NOT_RESPONDING": "NOT_RESPONDING",
    "PLANNED": "PLANNED", "FAILING": "FAIL", "FAIL": "FAIL", "UNK": "UNKNOWN",
}  # fmt: skip
_NODE_SUFFIX_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "%": "POWERING_DOWN",
                      "!": "POWER_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
                      "-": "PLANNED"}  # fmt: skip


def node_state(value: Any, extra_flags: Iterable[str] = ()) -> tuple[str, frozenset[str]]:
    """``"idle"`` + ``["DRAIN"]`` / ``["IDLE", "DRAIN"]`` / ``"DOWN+DRAIN+NOT_RESPONDING"`` / ``"down*"``."""
    if isinstance(value, list):
        raw = [str(v) for v in value]
    elif isinstance(value, str):
        raw = [t for t in re.split(r"[+,\s]+", value.strip()) if t]
    else:
        raw = []
    tokens: list[str] = []
    for token in [*raw, *extra_flags]:
        token = str(token).strip().upper()
        while token and token[-1] in _NODE_SUFFIX_FLAGS:
            tokens.append(_NODE_SUFFIX_FLAGS[token[-1]])
            token = token[:-1]
        if token:
            tokens.append(token)
    base = "UNKNOWN"
    flags: set[str] = set()
    for token in tokens:
        if token in NODE_BASE_STATES:
            if base == "UNKNOWN":
                base = token
            continue
        if token in ("DRAINED", "DRAINING", "DRNG"):
            flags.add("DRAIN")
        mapped = _NODE_STATE_ALIASES.get(token, token)
        if mapped in NODE_BASE_STATES:
            if base == "UNKNOWN":
                base = mapped
        else:
            flags.add(mapped)
    return base, frozenset(flags)


def exit_status(value: Any) -> tuple[int | None, int | None]:
    """Exit code + signal from ``"1:0"``, a raw wait status int, or ``{return_code, signal: {id}}``."""
    if isinstance(value, Mapping):
        code = number(value.get("return_code"))
        sig = value.get("signal")
        signal = number(sig.get("id") if isinstance(sig, Mapping) else sig) or None
        return (0 if code is None and signal else code), signal
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+)(?::([0-9]+))?\s*", value)
        if not m:
            return None, None
        signal_n = int(m.group(2)) if m.group(2) is not None else 0
        return int(m.group(1)), signal_n or None
    n = number(value)
    if n is None:
        return None, None
    return (n >> 8) & 0xFF, (n & 0x7F) or None  # a raw wait status, as 22.05's JSON reports it


@typed_errors
def load_json(output: str) -> dict[str, Any]:
    """Parse a Slurm JSON document; Slurm prints warnings to stderr, but be tolerant of leading noise."""
    start = output.find("{")
    if start < 0:
        raise ParseError("no JSON object in the output")
    try:
        data = json.loads(output[start:])
    except json.JSONDecodeError as exc:
        raise ParseError(f"invalid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ParseError("the JSON document is not an object")
    return data


# ---------------------------------------------------------------------------------------------- jobs


UNLIMITED_END_S = 365 * 24 * 3600


def _json_end_time(job: Mapping[str, Any], base: str | None) -> int | None:
    """``end_time``, except where scontrol prints ``EndTime=Unknown``: for a job without a time limit, Slurm
    keeps start + 365 days as its "end" while it runs, and a meaningless value while it is pending (both measured
    on 24.11.5). A preempted job's real deadline (preempt time + grace) is kept."""
    end = timestamp(job.get("end_time"))
    limit = job.get("time_limit")
    if end is None or not (isinstance(limit, Mapping) and limit.get("infinite") is True):
        return end
    start = timestamp(job.get("start_time"))
    if base == "PENDING" or (start is not None and end - start == UNLIMITED_END_S):
        return None
    return end


_TEXT_FIELDS = ("name", "reason", "batch_host", "partition")
_HOSTLIST_FIELDS = ("nodes", "excluded_nodes")
_TIME_FIELDS = ("submit_time", "start_time", "end_time", "preempt_time")


def job_info(fields: Mapping[str, Any], keys: Mapping[str, str], *, job_id: str, raw_job_id: str, source: str,
             time_value: Callable[[Any], int | None] = timestamp, **derived: Any) -> JobInfo:  # fmt: skip
    """The one builder of a :class:`JobInfo` from any source's fields. ``keys`` maps JobInfo's names (and
    ``state``, ``exit``) to the source's; every source's state, exit status, texts, node lists and numbers are
    normalised here the same way, its times by ``time_value``. ``derived``: fields the source works out itself
    (a time limit in its own format, an end time with its own exceptions)."""

    def value(name: str) -> Any:
        return fields.get(keys[name]) if name in keys else None

    base, flags = job_state(value("state"))
    code, signal = exit_status(value("exit"))
    built: dict[str, Any] = {
        "job_id": validate_job_id(job_id), "state": effective_job_state(base, flags), "base_state": base,
        "flags": flags, "exit_code": code, "exit_signal": signal, "restart_count": number(value("restart_count")) or 0,
        "priority": number(value("priority")), "source": source, "raw_job_id": raw_job_id,
        **{f: text(value(f)) for f in _TEXT_FIELDS}, **{f: hostlist_field(value(f)) for f in _HOSTLIST_FIELDS},
        **{f: time_value(value(f)) for f in _TIME_FIELDS},
    }  # fmt: skip
    return JobInfo(**{**built, **derived})


_JSON_KEYS = {
    "state": "job_state", "exit": "exit_code", "name": "name", "reason": "state_reason", "restart_count": "restart_cnt",
    "nodes": "nodes", "batch_host": "batch_host", "excluded_nodes": "excluded_nodes", "partition": "partition",
    "submit_time": "submit_time", "start_time": "start_time", "preempt_time": "preempt_time", "priority": "priority",
}  # fmt: skip


def job_from_json(job: Mapping[str, Any]) -> JobInfo:
    """One element of ``squeue --json``'s ``jobs`` array (any supported version)."""
    job_id_n = number(job.get("job_id"))
    if job_id_n is None:
        raise ParseError("job without job_id")
    job_id = display_id(
        str(job_id_n),
        number(job.get("array_job_id")),
        number(job.get("array_task_id")),
        number(job.get("het_job_id")),
        number(job.get("het_job_offset")),
    )
    requeue = job.get("requeue")
    return job_info(
        job, _JSON_KEYS, job_id=job_id, raw_job_id=str(job_id_n), source="squeue-json",
        end_time=_json_end_time(job, job_state(job.get("job_state"))[0]),
        requeue=bool(requeue) if isinstance(requeue, bool | int) else None,
        time_limit_min=number(job.get("time_limit")),
    )  # fmt: skip


@typed_errors
def parse_squeue_json(output: str) -> list[JobInfo]:
    """All jobs in a ``squeue --json`` document."""
    data = load_json(output)
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        raise ParseError("no 'jobs' array")
    return [job_from_json(j) for j in jobs if isinstance(j, Mapping)]


def display_id(
    raw: str, array_job: int | None, array_task: int | None, het_job: int | None, het_offset: int | None
) -> str:
    """The id users see: ``123_4`` for an array task, ``123+1`` for a het component, else the raw id."""
    if array_job and array_task is not None and array_task < 0xFFFFFFFE:
        return f"{array_job}_{array_task}"
    if het_job and het_offset is not None:
        return f"{het_job}+{het_offset}"
    return raw


# ---------------------------------------------------------------------------------------------- nodes


def _node_from_json(node: Mapping[str, Any]) -> NodeInfo:
    name = text(node.get("name")) or text(node.get("hostname"))
    if not name:
        raise ParseError("node without a name")
    base, flags = node_state(node.get("state"), node.get("state_flags") or ())
    parts = node.get("partitions") or ()
    return NodeInfo(
        name=name,
        state=base,
        flags=flags,
        reason=text(node.get("reason")),
        reason_user=text(node.get("reason_set_by_user")),
        reason_time=timestamp(node.get("reason_changed_at")),
        partitions=tuple(str(p) for p in parts) if isinstance(parts, list) else tuple(str(parts).split(",")),
        source="sinfo-json",
    )


def _nodes_from_sinfo_group(group: Mapping[str, Any]) -> list[NodeInfo]:
    """23.02+ ``sinfo --json``: node groups sharing a state/reason/partition."""
    node = group.get("node") or {}
    base, flags = node_state(node.get("state"))
    names_field = (group.get("nodes") or {}).get("nodes") or []
    reason = group.get("reason") or {}
    if isinstance(reason, str):
        reason = {"description": reason}
    partition = text((group.get("partition") or {}).get("name"))
    return [
        NodeInfo(
            name=name,
            state=base,
            flags=flags,
            reason=text(reason.get("description")),
            # 26.05 (data_parser v0.0.45) moved the user out of the reason, to the group's reason_set_by_user
            reason_user=text(reason.get("user")) or text(group.get("reason_set_by_user")),
            reason_time=timestamp(reason.get("time")),
            partitions=(partition,) if partition else (),
            source="sinfo-json",
        )
        for name in hostlist_field(names_field)
    ]


@typed_errors
def parse_nodes_json(output: str) -> list[NodeInfo]:
    """``sinfo --json`` (22.05 or 23.02+ shape) or ``scontrol show node --json`` -> one NodeInfo per node.

    Nodes that appear in several partition groups are merged (partitions united).
    """
    data = load_json(output)
    if isinstance(data.get("nodes"), list):
        return [_node_from_json(n) for n in data["nodes"] if isinstance(n, Mapping)]
    if isinstance(data.get("sinfo"), list):
        merged: dict[str, NodeInfo] = {}
        for group in data["sinfo"]:
            if not isinstance(group, Mapping):
                continue
            for info in _nodes_from_sinfo_group(group):
                old = merged.get(info.name)
                if old is not None:
                    parts = tuple(dict.fromkeys(old.partitions + info.partitions))
                    info = NodeInfo(**{**old.__dict__, "partitions": parts})
                merged[info.name] = info
        return list(merged.values())
    raise ParseError("neither a 'nodes' nor a 'sinfo' array")

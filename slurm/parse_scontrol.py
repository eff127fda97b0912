"""Pure parsers of Slurm's text output: ``scontrol show job|node -o`` (one ``Key=Value`` line per record, where
free-text values such as ``Reason=Not responding [slurm@...]`` may contain spaces) and ``squeue --steps`` lines.

The JSON shapes and the scalar field parsers they share live in ``slurm/parse.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from slurm.model import JobInfo, NodeInfo
from slurm.parse import (
    ParseError,
    display_id,
    job_info,
    node_state,
    number,
    scontrol_time,
    text,
    typed_errors,
)

_KEY_RE = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_:/.]*)=")
FREE_TEXT_KEYS = frozenset({"Reason", "Comment", "Extra", "AdminComment", "SystemComment", "Command", "WorkDir",
                            "StdErr", "StdIn", "StdOut", "Features", "ActiveFeatures", "AvailableFeatures"})  # fmt: skip
"""Keys whose values may contain spaces; a following ``Word=`` only ends them if ``Word`` is a known key."""
KNOWN_KEYS = frozenset("""
JobId ArrayJobId ArrayTaskId JobName UserId GroupId MCS_label Priority Nice Account QOS JobState Reason Dependency
Requeue Restarts BatchFlag Reboot ExitCode DerivedExitCode RunTime TimeLimit TimeMin SubmitTime EligibleTime
AccrueTime StartTime EndTime Deadline SuspendTime SecsPreSuspend LastSchedEval Scheduler Partition AllocNode:Sid
ReqNodeList ExcNodeList NodeList BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T TRES Socks/Node
NtasksPerN:B:S:C CoreSpec MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode Features DelayBoot OverSubscribe
Contiguous Licenses Network Command WorkDir StdErr StdIn StdOut Power Comment PreemptEligibleTime PreemptTime
HetJobId HetJobOffset HetJobIdSet Reservation TresPerNode TresPerTask MailUser MailType CpusPerTres MemPerTres
NodeName Arch CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures ActiveFeatures Gres NodeAddr
NodeHostName Version OS RealMemory AllocMem FreeMem Sockets Boards State ThreadsPerCore TmpDisk Weight Owner
MCS_label Partitions BootTime SlurmdStartTime LastBusyTime ResumeAfterTime CfgTRES AllocTRES CapWatts
CurrentWatts AveWatts ExtSensorsJoules ExtSensorsWatts ExtSensorsTemp Reason Comment Extra InstanceId
InstanceType Port CPUSpecList MemSpecLimit GresDrain GresUsed LastSchedEval ResvPort SiblingsActive
SiblingsViable Container ContainerID Prolog Epilog AdminComment SystemComment KillOInInvalidDependent
""".split())  # fmt: skip


@typed_errors
def parse_key_values(line: str) -> dict[str, str]:
    """One ``scontrol show ... -o`` line -> {key: value}.

    A value ends where the next `` Key=`` begins, except inside free-text keys (Reason, Comment...), which only
    end at a key Slurm is known to print next, so ``Reason=Not responding [slurm@...]`` stays whole.
    """
    matches = list(_KEY_RE.finditer(line))
    out: dict[str, str] = {}
    current: str | None = None
    value_start = 0
    for m in matches:
        key = m.group(1)
        if current is not None:
            if current in FREE_TEXT_KEYS and key not in KNOWN_KEYS:
                continue  # "Word=" inside a free-text value
            out[current] = line[value_start : m.start()].strip()
        current = key
        value_start = m.end()
    if current is not None:
        out[current] = line[value_start:].strip()
    return out


def job_from_scontrol(fields: Mapping[str, str]) -> JobInfo:
    """``scontrol show job -o`` fields -> JobInfo."""
    raw_id = fields.get("JobId")
    if not raw_id:
        raise ParseError("no JobId in scontrol output")
    job_id = display_id(
        raw_id,
        number(fields.get("ArrayJobId")),
        number(fields.get("ArrayTaskId")),
        number(fields.get("HetJobId")),
        number(fields.get("HetJobOffset")),
    )
    requeue = fields.get("Requeue")
    limit = fields.get("TimeLimit")
    return job_info(
        fields, _SCONTROL_KEYS, job_id=job_id, raw_job_id=raw_id, source="scontrol", time_value=scontrol_time,
        requeue=(requeue == "1") if requeue in ("0", "1") else None,
        time_limit_min=duration_minutes(limit) if limit else None,
    )  # fmt: skip


_SCONTROL_KEYS = {
    "state": "JobState", "exit": "ExitCode", "name": "JobName", "reason": "Reason", "restart_count": "Restarts",
    "nodes": "NodeList", "batch_host": "BatchHost", "excluded_nodes": "ExcNodeList", "partition": "Partition",
    "submit_time": "SubmitTime", "start_time": "StartTime", "end_time": "EndTime", "preempt_time": "PreemptTime",
    "priority": "Priority",
}  # fmt: skip


def duration_minutes(value: str) -> int | None:
    """scontrol durations ``[D-]HH:MM:SS`` / ``MM:SS`` / ``UNLIMITED`` -> whole minutes (rounded up)."""
    s = value.strip()
    m = re.fullmatch(r"(?:([0-9]+)-)?(?:([0-9]+):)?([0-9]+):([0-9]+)", s)
    if not m:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    return -(-total // 60)


@typed_errors
def parse_scontrol_jobs(output: str) -> list[JobInfo]:
    """All ``scontrol show job -o`` lines."""
    return [job_from_scontrol(parse_key_values(ln)) for ln in output.splitlines() if ln.strip().startswith("JobId=")]




def node_from_scontrol(fields: Mapping[str, str]) -> NodeInfo:
    name = fields.get("NodeName")
    if not name:
        raise ParseError("no NodeName in scontrol output")
    base, flags = node_state(fields.get("State", ""))
    reason = text(fields.get("Reason"))
    user, when = None, None
    if reason:
        m = re.fullmatch(r"(.*?)\s*\[([^@\]]+)@([0-9T:-]+)\]", reason)
        if m:
            reason, user, when = m.group(1) or None, m.group(2), scontrol_time(m.group(3))
    parts = text(fields.get("Partitions"))
    return NodeInfo(
        name=name,
        state=base,
        flags=flags,
        reason=reason,
        reason_user=user,
        reason_time=when,
        partitions=tuple(parts.split(",")) if parts else (),
        source="scontrol",
    )


@typed_errors
def parse_scontrol_nodes(output: str) -> list[NodeInfo]:
    """All ``scontrol show node -o`` lines."""
    lines = [ln for ln in output.splitlines() if ln.strip().startswith("NodeName=")]
    return [node_from_scontrol(parse_key_values(ln)) for ln in lines]


def parse_step_names(output: str) -> dict[str, str]:
    """``squeue --steps --noheader --format='%i %j'`` -> {step name: step id ("123.4")}.

    Lines that are not "<id> <name>" (a blank line, a warning) are skipped; a later step of the same name wins,
    as the newest one is the one to act on."""
    out: dict[str, str] = {}
    for line in output.splitlines():
        parts = line.split()
        if len(parts) == 2 and re.fullmatch(r"\d+(?:_\d+)?(?:\+\d+)?\.(?:\d+|batch|extern|interactive)", parts[0]):
            out[parts[1]] = parts[0]
    return out


def parse_node_addresses(output: str) -> dict[str, str]:
    """``scontrol show node -o NODES`` -> NodeName -> NodeAddr, for the lines that have both."""
    out: dict[str, str] = {}
    for line in output.splitlines():
        if not line.strip().startswith("NodeName="):
            continue
        fields = parse_key_values(line.strip())
        name, addr = text(fields.get("NodeName")), text(fields.get("NodeAddr"))
        if name and addr:
            out[name] = addr
    return out


def parse_node_address(output: str, node: str) -> str | None:
    """``scontrol show node -o NODE`` -> the node's NodeAddr (where its processes can be reached), or None
    when the output has no line for ``node`` or no address."""
    for line in output.splitlines():
        if not line.strip().startswith("NodeName="):
            continue
        fields = parse_key_values(line.strip())
        if fields.get("NodeName") == node:
            return text(fields.get("NodeAddr"))
    return None

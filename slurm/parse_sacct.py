"""Pure parsers for job history: ``sacct`` output -> one ``JobRun`` per run of a job (each requeue adds one).

22.05's ``sacct --json`` reports exit code 0 for failed jobs, so the adapter reads history from
``sacct -X --duplicates --parsable2`` text (``SACCT_FIELDS``); the JSON parser serves 23.02+ documents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slurm.hostlist import validate_job_id
from slurm.model import JobRun
from slurm.parse import (
    ParseError,
    effective_job_state,
    exit_status,
    hostlist_field,
    job_state,
    load_json,
    number,
    scontrol_time,
    text,
    timestamp,
    typed_errors,
)


def _run_from_sacct(job: Mapping[str, Any]) -> JobRun:
    job_id_n = number(job.get("job_id"))
    if job_id_n is None:
        raise ParseError("sacct job without job_id")
    state_field = job.get("state") or {}
    if isinstance(state_field, Mapping):
        base, flags = job_state(state_field.get("current"))
        reason = text(state_field.get("reason"))
    else:
        base, flags = job_state(state_field)
        reason = None
    times = job.get("time") or {}
    code, signal = exit_status(job.get("exit_code"))
    restarts = job.get("restart_cnt")
    return JobRun(
        job_id=str(job_id_n),
        state=effective_job_state(base, flags),
        reason=reason,
        nodes=hostlist_field(job.get("nodes")),
        submit_time=timestamp(times.get("submission")),
        start_time=timestamp(times.get("start")),
        end_time=timestamp(times.get("end")),
        exit_code=code,
        exit_signal=signal,
        restart_count=number(restarts) if restarts is not None else None,
    )


@typed_errors
def parse_sacct_json(output: str) -> list[JobRun]:
    """``sacct --json --duplicates`` -> runs, oldest submit first."""
    data = load_json(output)
    jobs = data.get("jobs")
    if not isinstance(jobs, list):
        raise ParseError("no 'jobs' array")
    runs = [_run_from_sacct(j) for j in jobs if isinstance(j, Mapping)]
    return sorted(runs, key=lambda r: (r.submit_time or 0, r.start_time or 0))


SACCT_FIELDS = ("JobIDRaw", "JobID", "State", "ExitCode", "NodeList", "Submit", "Start", "End", "Reason")
"""``sacct --format`` for ``parse_sacct_text``; these fields exist from 22.05 to 24.11."""


@typed_errors
def parse_sacct_text(output: str) -> list[JobRun]:
    """``sacct -X --duplicates --parsable2 --noheader --format=<SACCT_FIELDS>`` -> runs, oldest first.

    ``restart_count`` is the run's position among the runs of the same job (0 for the first run).
    """
    runs: list[tuple[str, JobRun]] = []
    for line in output.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != len(SACCT_FIELDS):
            raise ParseError(f"expected {len(SACCT_FIELDS)} '|'-separated fields, got {line!r}")
        row = dict(zip(SACCT_FIELDS, parts, strict=True))
        base, flags = job_state(row["State"].split(" ", 1)[0])
        code, signal = exit_status(row["ExitCode"])
        run = JobRun(
            job_id=validate_job_id(row["JobID"]) if "[" not in row["JobID"] else row["JobIDRaw"],
            state=effective_job_state(base, flags),
            reason=text(row["Reason"]),
            nodes=hostlist_field(row["NodeList"]),
            submit_time=scontrol_time(row["Submit"]),
            start_time=scontrol_time(row["Start"]),
            end_time=scontrol_time(row["End"]),
            exit_code=code,
            exit_signal=signal,
        )
        runs.append((row["JobIDRaw"], run))
    runs.sort(key=lambda item: (item[1].submit_time or 0, item[1].start_time or 0))
    seen: dict[str, int] = {}
    out = []
    for raw, run in runs:
        index = seen.get(raw, 0)
        seen[raw] = index + 1
        out.append(JobRun(**{**run.__dict__, "restart_count": index}))
    return out

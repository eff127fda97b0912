"""How often the supervisor asks slurmctld about its job: as seldom as its guarantees allow.

One controller serves every campaign of a site; a query every 3 s per campaign is hundreds of RPCs per second at
a thousand campaigns, the load SchedMD asks sites to avoid. The background query exists for two things only:

* **a preemption whose user signal never came** (measured on 22.05: 1 preemption in 3 sent the batch shell no
  signal, then SIGTERM at the grace time's end). It matters only when the job *can* be preempted with a grace time
  to use: then the query runs every quarter of the grace time, so a lost signal still leaves three quarters of it
  for the checkpoint. A partition that cannot be preempted (``PreemptType=preempt/none``, or ``PreemptMode=OFF``)
  or preempts without grace (the SIGTERM comes at once, to every step: nothing to poll for) needs no fast query.
* **the time limit's EndTime** (the time-limit clock confirms its own warning with Slurm's newest answer; a limit
  extended meanwhile is kept). The clock asks for a fresh answer when it needs one (``PreemptionPoller.refresh``),
  so it costs no steady-state queries.

What is not known (the settings could not be read) is treated as preemptible with an unknown grace time: today's
fast query, never a missed preemption. Pure: the driver reads the settings once per Slurm run and passes them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

FLOOR_S = 3.0  # the fastest query: an unknown grace time, or a short one
STEADY_S = 300.0  # nothing to watch for: one query per 5 minutes (the job's state still reaches the journal)
GRACE_SHARE = 0.25  # a lost preemption signal is caught with at least 3/4 of the grace time left


@dataclass(frozen=True)
class Preemptibility:
    """Whether Slurm can preempt the job (None: unknown) and the grace time it would give (None: unknown)."""

    can_be_preempted: bool | None
    grace_s: float | None
    why: str


UNKNOWN = Preemptibility(None, None, "the partition's preemption settings are unknown")


def preemptibility(config: Mapping[str, str] | None, partition: Mapping[str, str] | None) -> Preemptibility:
    """From ``scontrol show config`` and the job's line of ``scontrol show partition -o`` (None: not read)."""
    if config is None or partition is None:
        return UNKNOWN
    kind = config.get("PreemptType", "").strip().lower()
    if kind in ("preempt/none", "none"):
        return Preemptibility(False, None, "PreemptType=preempt/none")
    mode = (partition.get("PreemptMode") or config.get("PreemptMode") or "").strip().upper()
    if not kind or not mode:
        return UNKNOWN
    if "OFF" in mode.split(","):
        return Preemptibility(False, None, f"partition {partition.get('PartitionName', '?')} has PreemptMode=OFF")
    grace = grace_seconds(partition.get("GraceTime", ""))
    return Preemptibility(True, grace, f"{kind}, PreemptMode={mode}, GraceTime={partition.get('GraceTime', '?')}")


_CLOCK = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", re.ASCII)


def grace_seconds(text: str) -> float | None:
    """``GraceTime`` as ``scontrol show partition`` prints it: seconds (``10``) or a clock (``00:05:00``,
    ``1-00:00:00``); None when it is neither."""
    text = text.strip()
    if text.isascii() and text.isdigit():  # ("²".isdigit() is True)
        return float(text)
    m = _CLOCK.fullmatch(text)
    if m is None:
        return None
    days, hours, minutes, seconds = (int(g) if g else 0 for g in m.groups())
    return float(((days * 24 + hours) * 60 + minutes) * 60 + seconds)


def poll_period(p: Preemptibility) -> float:
    """Seconds between two background queries of the job."""
    if p.can_be_preempted is False:
        return STEADY_S
    if p.can_be_preempted is None or p.grace_s is None:
        return FLOOR_S
    if p.grace_s <= 0:
        return STEADY_S  # preempted without grace: every step gets SIGTERM at once, nothing to catch early
    return min(STEADY_S, max(FLOOR_S, p.grace_s * GRACE_SHARE))

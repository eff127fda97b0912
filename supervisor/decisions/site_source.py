"""Which kind of evidence a campaign's node verdict rests on, for the site ledger (``decisions/site_trust.py``).

From the interruption's witnesses (``decisions/interruption.py``: who saw the evidence that blames the nodes):

* ``slurm``: slurmctld saw it (the node DOWN, NOT_RESPONDING, a node-failure reason): no user controls that;
* ``node``: the node agent read it from the node itself for a hardware fault (its health check: NVML, the
  kernel's Xid lines, ECC counters) — the project's code, not the program's;
* ``program``: everything else — the program's printed text (an Xid line a program printed is still text), its
  exits, and what the agent inferred from the program's behaviour (heartbeats that stopped, its own silence: a
  program can kill the agent it shares a user with).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from supervisor.decisions import events as ev
from supervisor.decisions.interruption import AGENT, SLURM, Interruption


def verdict_source(interruption: Interruption) -> str:
    witnesses = set(interruption.witnesses)
    if SLURM in witnesses and interruption.cls in (ev.NODE_FAILURE, ev.HARDWARE):
        return "slurm"
    if AGENT in witnesses and interruption.cls == ev.HARDWARE:
        return "node"
    return "program"


_GPU_CHECK = re.compile(r"(gpu\d+_|gpus_|xid$)")


def healthcheck_verdict(problems: Sequence[Any]) -> tuple[str, list[str]] | None:
    """What ``supervise healthcheck --drain`` tells the site when it drains its node (source ``node``: read from
    the node by the project's code): ``hardware`` when a fatal problem is the GPUs' (NVML, Xid, ECC, row remaps,
    GPUs missing), else ``node_unfit`` (a full or unreadable filesystem, /dev/shm, the clock); the fatal problems'
    lines as evidence (the repair loop reads an Xid code from them). None when nothing is fatal."""
    fatal = [p for p in problems if p.severity == "fatal"]
    if not fatal:
        return None
    klass = ev.HARDWARE if any(_GPU_CHECK.match(p.check) for p in fatal) else "node_unfit"
    return klass, [f"{p.what} ({p.reason()})"[:1000] for p in fatal][:20]

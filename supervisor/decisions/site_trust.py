"""Who may take a node away from whom, at a site where many users' campaigns share one node ledger (issue 24).

A campaign's verdict on a node is evidence about the node *and* about the campaign's own program: a program that
crashes on every node it touches, or prints "uncorrectable ECC error" on purpose, would otherwise drain a fleet.
So a verdict is sorted by where its evidence came from:

* ``node``: read from the node by the project's own code, not the program — the node agent's NVML and kernel Xid
  readings, ECC counters, a failed probe or health check (``supervise healthcheck``);
* ``slurm``: slurmctld's own view (the node DOWN / NOT_RESPONDING while the job ran);
* ``program``: anything the user's processes control — their printed text, their exit codes, their heartbeats
  stopping (a hang may be the program's own deadlock).

A user's own verdicts of any source apply to that user's campaigns at once (they lose their own work to it).
Another user's campaigns are kept off a node only on ``node`` or ``slurm`` evidence, or when the lemon rule
(``decisions/lemon.py``) found the node failing in jobs of several users; ``program`` evidence alone never
crosses users. Pure: the site service passes the verdicts it holds and the lemon scores.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

SOURCES = ("node", "slurm", "program")
CROSSES_USERS = frozenset({"node", "slurm"})


@dataclass(frozen=True)
class SiteVerdict:
    """One campaign's blame of one node, as the site recorded it."""

    node: str
    user: str
    source: str  # one of SOURCES
    klass: str
    campaign: str
    t: float

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"verdict source must be one of {', '.join(SOURCES)}, got {self.source!r}")


@dataclass(frozen=True)
class Exclusion:
    node: str
    why: str


def excluded_for(user: str, verdicts: Iterable[SiteVerdict], lemons: Iterable[str] = (),
                 forgiven_at: dict[str, float] | None = None) -> list[Exclusion]:  # fmt: skip
    """The nodes ``user``'s next launch must leave out, each with the reason; ``forgiven_at``: node -> when an
    operator returned it to service (verdicts from before then no longer count; the lemon rule is judged by the
    caller on failures since then)."""
    forgiven = forgiven_at or {}
    out: dict[str, str] = {}
    for node in sorted(set(lemons)):
        out[node] = "a lemon: it failed in the jobs of several users far more often than the fleet"
    for v in sorted(verdicts, key=lambda v: (v.t, v.node)):
        if v.node in out or v.t < forgiven.get(v.node, float("-inf")):
            continue
        if v.user == user:
            out[v.node] = f"your campaign {v.campaign} blamed it ({v.klass}, {v.source} evidence)"
        elif v.source in CROSSES_USERS:
            out[v.node] = f"{v.klass} read from the {'node itself' if v.source == 'node' else 'Slurm controller'} " \
                          f"in another user's campaign"  # fmt: skip
    return [Exclusion(node, why) for node, why in sorted(out.items())]

"""Which Slurm failures are worth retrying, and how long to keep trying.

slurmctld is routinely busy or restarting for a few seconds (failover, reconfigure, RPC storms); a supervisor
that gives up on the first "Socket timed out" would turn a hiccup into a lost job. But retrying a request that
*may* have reached slurmctld is only safe when repeating it is harmless, hence ``Failure.delivery``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass


class Failure(enum.Enum):
    """Classification of one failed Slurm command."""

    NOT_SENT = "not_sent"
    """slurmctld could not be reached at all: safe to retry any request."""
    MAYBE_SENT = "maybe_sent"
    """Timed out or busy: the request may have been applied; retry only idempotent requests."""
    UNKNOWN_JOB = "unknown_job"
    """The job id is unknown (never existed, or finished longer than MinJobAge ago)."""
    ACCOUNTING_DISABLED = "accounting_disabled"
    """sacct without slurmdbd."""
    PERMANENT = "permanent"
    """Slurm refused the request; retrying gives the same answer."""


_NOT_SENT = re.compile(
    r"unable to contact slurm controller|connection refused|connect failure|"
    r"unable to establish (?:a )?connection|slurm_open_msg_conn|unable to resolve|"
    r"backup controller in standby mode|communication connection failure|"
    r"could not establish a configuration source|failed to fetch config",
    re.IGNORECASE,
)
_MAYBE_SENT = re.compile(
    r"socket timed out|timed out on send/recv|zero bytes were transmitted or received|"
    r"slurm controller not responding|slurmctld is busy|resource temporarily unavailable|"
    r"transport endpoint is not connected|connection reset by peer|broken pipe|"
    r"temporarily unable to accept job|unexpected message received",
    re.IGNORECASE,
)
_UNKNOWN_JOB = re.compile(r"invalid job id specified|unknown job|job does not exist", re.IGNORECASE)
_ACCOUNTING = re.compile(r"accounting storage is disabled", re.IGNORECASE)


def classify_failure(returncode: int | None, stderr: str, timed_out: bool = False) -> Failure:
    """Classify a failed command from its exit status and Slurm's message (pure; unit-tested).

    ``timed_out`` means our own timeout killed the command: slurmctld may or may not have acted.
    """
    if timed_out:
        return Failure.MAYBE_SENT
    if _ACCOUNTING.search(stderr):
        return Failure.ACCOUNTING_DISABLED
    if _NOT_SENT.search(stderr):
        return Failure.NOT_SENT
    if _MAYBE_SENT.search(stderr):
        return Failure.MAYBE_SENT
    if _UNKNOWN_JOB.search(stderr):
        return Failure.UNKNOWN_JOB
    return Failure.PERMANENT


def should_retry(failure: Failure, idempotent: bool) -> bool:
    """Retry unreached requests always, possibly-applied ones only when repeating them is harmless."""
    if failure is Failure.NOT_SENT:
        return True
    return failure is Failure.MAYBE_SENT and idempotent


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff: ``initial_s`` doubling up to ``max_s``, for at most ``budget_s`` in total.

    The defaults ride out a slurmctld restart (~10-20 s) without stalling a supervisor for minutes.
    """

    budget_s: float = 60.0
    initial_s: float = 0.5
    max_s: float = 8.0
    call_timeout_s: float = 30.0
    """Timeout of one command; it is also capped by the budget left."""

    def __post_init__(self) -> None:
        for name in ("budget_s", "initial_s", "max_s", "call_timeout_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"RetryPolicy.{name} must be >= 0")

    def backoff(self, attempt: int) -> float:
        """Delay before retry number ``attempt`` (1-based): initial * 2**(attempt-1), capped."""
        return min(self.max_s, self.initial_s * (2 ** max(0, attempt - 1)))


NO_RETRY = RetryPolicy(budget_s=0.0)

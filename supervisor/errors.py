"""User-facing errors: one line naming the problem and the fix, and a distinct exit code each.

The exit codes are part of the CLI contract (README, "Exit codes"); never renumber them.
"""

from __future__ import annotations


class SupervisorError(Exception):
    """Base error: ``problem`` says what is wrong, ``fix`` what the user should do about it."""

    exit_code = 1

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def one_line(self) -> str:
        text = f"supervise: error: {self.problem}"
        if self.fix:
            text += f" (fix: {self.fix})"
        return text.replace("\n", " ")


class UsageError(SupervisorError):
    """Bad command-line flags or arguments."""

    exit_code = 2


class ConfigError(SupervisorError):
    """A config file or value is invalid."""

    exit_code = 3


class SlurmUnavailable(SupervisorError):
    """slurmctld cannot be reached (after retries) or the Slurm commands are missing."""

    exit_code = 4


class SlurmRejected(SupervisorError):
    """Slurm refused a request (bad job id, permission denied, invalid option...)."""

    exit_code = 5


class CheckpointError(SupervisorError):
    """No valid checkpoint, or a checkpoint operation failed."""

    exit_code = 6


class CampaignError(SupervisorError):
    """The campaign directory is missing, unreadable or not a campaign."""

    exit_code = 7


class HealthCheckFailed(SupervisorError):
    """A node health check found a problem."""

    exit_code = 8


EXIT_CODES: dict[int, str] = {
    0: "success",
    1: "the supervised run failed or stopped (see the report)",
    2: "usage error: bad flags or arguments",
    3: "configuration error",
    4: "Slurm unavailable: slurmctld unreachable or Slurm commands missing",
    5: "Slurm rejected a request",
    6: "checkpoint error: none valid, or a save/verify failed",
    7: "campaign directory missing or unreadable",
    8: "health check failed",
    130: "interrupted (Ctrl-C)",
}

"""User-facing errors: one line naming the problem and the fix, and a distinct exit code each.

The exit codes are part of the CLI contract (README, "Exit codes"); never renumber them.
"""

from __future__ import annotations

from slurm.errors import OneLineError


class SupervisorError(OneLineError):
    """Base of this package's errors (``problem``, ``fix``, ``one_line()``: ``slurm.errors.OneLineError``)."""

    exit_code = 1


class UsageError(SupervisorError):
    """Bad command-line flags or arguments."""

    exit_code = 2


class ConfigError(SupervisorError):
    """A config file or value is invalid."""

    exit_code = 3


class CheckpointError(SupervisorError):
    """No valid checkpoint, or a checkpoint operation failed."""

    exit_code = 6


class CampaignError(SupervisorError):
    """The campaign directory is missing, unreadable or not a campaign."""

    exit_code = 7


class SiteError(SupervisorError):
    """The site service: unreachable, it refused a request, or its database is unreadable."""

    exit_code = 9


class HealthCheckFailed(SupervisorError):
    """A node health check found a problem."""

    exit_code = 8


# Exit codes of the errors the Slurm adapter raises (``slurm.errors``, which knows nothing of this package):
# ``supervisor.cli`` maps them with :func:`exit_code_of`.
EXIT_SLURM_UNAVAILABLE = 4
EXIT_SLURM_REJECTED = 5


def exit_code_of(err: BaseException) -> int:
    """The CLI exit code for an error of this package or of ``slurm`` (README, "Exit codes")."""
    from slurm import errors as slurm_errors

    if isinstance(err, SupervisorError):
        return err.exit_code
    if isinstance(err, slurm_errors.SlurmUnavailable):
        return EXIT_SLURM_UNAVAILABLE
    if isinstance(err, slurm_errors.SlurmRejected):
        return EXIT_SLURM_REJECTED
    if isinstance(err, slurm_errors.SlurmUsageError):
        return UsageError.exit_code
    if isinstance(err, slurm_errors.SlurmConfigError):
        return ConfigError.exit_code
    return 1


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
    9: "site service: unreachable, refused the request, or its database unreadable",
    130: "interrupted (Ctrl-C)",
}

"""Typed Slurm errors, independent of the supervisor package (``slurm`` imports nothing from ``supervisor``).

Four families, each a :class:`SlurmError` with ``problem`` and ``fix``: :class:`SlurmUnavailable` (slurmctld
unreachable, commands missing), :class:`SlurmRejected` (Slurm refused a request or printed something
unparseable), :class:`SlurmUsageError` (bad input: job ids, node names, signals) and :class:`SlurmConfigError`
(an impossible SLURM_* environment). ``supervisor.cli`` maps the families to the CLI's exit codes (4, 5, 2, 3;
README, "Exit codes"). Each command error carries the argv and Slurm's own message, because that message is
what an operator searches for.
"""

from __future__ import annotations

from collections.abc import Sequence


class OneLineError(Exception):
    """The one error base of the project (``supervisor.errors.SupervisorError`` derives from it too): ``problem``
    says what is wrong, ``fix`` what to do about it, and :meth:`one_line` is what the CLI prints. It lives here
    because ``slurm`` imports nothing from ``supervisor``."""

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def one_line(self) -> str:
        return f"supervise: error: {self.plain()}"

    def plain(self) -> str:
        """The problem and the fix without the command's prefix (for a journal line, an API answer)."""
        text = self.problem + (f" (fix: {self.fix})" if self.fix else "")
        return text.replace("\n", " ")


class SlurmError(OneLineError):
    """Base of every error raised by ``slurm``."""


class SlurmUnavailable(SlurmError):
    """slurmctld cannot be reached (after retries) or the Slurm commands are missing."""


class SlurmRejected(SlurmError):
    """Slurm refused a request (bad job id, permission denied, invalid option...)."""


class SlurmUsageError(SlurmError):
    """Bad input to the adapter: a job id, node name, signal or option that Slurm would misread."""


class SlurmConfigError(SlurmError):
    """The Slurm environment (SLURM_* variables) is inconsistent."""


def _argv_text(argv: Sequence[str]) -> str:
    return " ".join(argv)


def _first_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else "(no message)"


class SlurmCommandError(SlurmRejected):
    """A Slurm command exited non-zero with an error that retrying will not fix."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str, fix: str = "") -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        super().__init__(
            f"'{_argv_text(argv)}' failed (exit {returncode}): {_first_line(stderr)}",
            fix or "read Slurm's message above; check the job id, your permissions and the options",
        )


class SlurmUnreachable(SlurmUnavailable):
    """slurmctld did not answer (or a command kept timing out) within the retry budget."""

    def __init__(self, argv: Sequence[str], detail: str, attempts: int = 1) -> None:
        self.argv = list(argv)
        self.detail = detail
        self.attempts = attempts
        super().__init__(
            f"Slurm did not answer '{_argv_text(argv)}' after {attempts} attempt(s): {_first_line(detail)}",
            "check that slurmctld is running and SLURM_CONF points at the right slurm.conf, then retry",
        )


class SlurmCommandMissing(SlurmUnavailable):
    """A Slurm client command (sbatch, squeue, ...) is not installed or not on PATH."""

    def __init__(self, command: str) -> None:
        self.command = command
        super().__init__(f"the Slurm command '{command}' was not found", "install slurm-client or fix PATH")


class SlurmOutputError(SlurmRejected):
    """A Slurm command succeeded but printed something this adapter cannot parse."""

    def __init__(self, argv: Sequence[str], problem: str) -> None:
        self.argv = list(argv)
        super().__init__(
            f"cannot parse the output of '{_argv_text(argv)}': {problem}",
            "report this with your Slurm version (sinfo -V); the adapter supports 22.05 to 24.11",
        )


class AccountingUnavailable(SlurmRejected):
    """sacct has no database to read (AccountingStorageType=accounting_storage/none)."""

    def __init__(self, argv: Sequence[str], stderr: str) -> None:
        self.argv = list(argv)
        self.stderr = stderr
        super().__init__(
            "Slurm accounting storage is disabled, so job history (sacct) is unavailable",
            "configure slurmdbd (AccountingStorageType=accounting_storage/slurmdbd) to get per-run history",
        )


class InvalidJobId(SlurmUsageError):
    """A job id is not ``123``, ``123_4`` (array task) or ``123+1`` (het component)."""

    def __init__(self, value: str) -> None:
        self.value = value
        super().__init__(
            f"invalid Slurm job id {value}",
            "use a number such as 123, an array task 123_4 or a het component 123+1",
        )


class InvalidNodeName(SlurmUsageError):
    """A node name contains characters that could be read as an option or shell syntax."""

    def __init__(self, value: str, reason: str) -> None:
        self.value = value
        super().__init__(f"invalid node name {value!r}: {reason}", "use the node names that sinfo -N prints")


class HostlistError(SlurmUsageError):
    """A hostlist expression is malformed (nested or unbalanced brackets, bad ranges)."""

    def __init__(self, expr: str, reason: str) -> None:
        self.expr = expr
        super().__init__(
            f"invalid hostlist {expr!r}: {reason}",
            "write it like node[01-03,7],gpu[1-2] (no nested brackets)",
        )


class BackendUnavailable(SlurmUnavailable):
    """The requested Slurm backend (e.g. pyslurm) cannot be used here."""

    def __init__(self, backend: str, reason: str, fix: str) -> None:
        self.backend = backend
        super().__init__(f"Slurm backend '{backend}' is unavailable: {reason}", fix)


class SlurmEnvError(SlurmConfigError):
    """A SLURM_* environment variable has a value Slurm would never set."""

    def __init__(self, variable: str, value: str, reason: str) -> None:
        self.variable = variable
        self.value = value
        super().__init__(
            f"environment variable {variable}={value!r} is invalid: {reason}",
            f"unset {variable} or run inside a real Slurm allocation",
        )


class UnknownJob(SlurmCommandError):
    """slurmctld does not know the job: a wrong id, or it ended more than MinJobAge ago."""

    def __init__(self, argv: Sequence[str], returncode: int, stderr: str) -> None:
        super().__init__(
            argv, returncode, stderr, fix="check the job id; finished jobs are forgotten after MinJobAge (see sacct)"
        )

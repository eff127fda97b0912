"""Running one Slurm command: a list argv (never a shell), a timeout, retries with bounded exponential backoff for
transient failures (``slurm.retry``), and typed errors (``slurm.errors``) that carry the argv and Slurm's own
message, because that message is what an operator searches for.

Why apart from ``cli_backend``: this is the plumbing every command shares; the client there knows which command
answers which question. The ``runner`` is injectable, so unit tests replay recorded outputs and a fake clock
drives the retries.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import tenacity

from slurm.errors import (
    AccountingUnavailable,
    SlurmCommandError,
    SlurmCommandMissing,
    SlurmUnreachable,
    SlurmUsageError,
    UnknownJob,
)
from slurm.retry import Failure, RetryPolicy, classify_failure, should_retry


@dataclass(frozen=True)
class RunResult:
    """What a runner returns for one finished command."""

    returncode: int
    stdout: str
    stderr: str


class Runner(Protocol):
    """Runs one command. Raises ``subprocess.TimeoutExpired`` on timeout, ``FileNotFoundError`` if missing."""

    def __call__(
        self, argv: Sequence[str], *, input_text: str | None, timeout: float, env: Mapping[str, str]
    ) -> RunResult: ...


def subprocess_runner(
    argv: Sequence[str], *, input_text: str | None, timeout: float, env: Mapping[str, str]
) -> RunResult:
    """The real runner: ``subprocess.run`` with a list argv, captured text output and a timeout."""
    proc = subprocess.run(  # noqa: S603 - argv is a list built from validated parts
        list(argv),
        input=input_text,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env),
        check=False,
        stdin=None if input_text is not None else subprocess.DEVNULL,
    )
    return RunResult(proc.returncode, proc.stdout or "", proc.stderr or "")


class _Transient(Exception):
    def __init__(self, argv: Sequence[str], detail: str) -> None:
        super().__init__(detail)
        self.argv = list(argv)
        self.detail = detail




class CommandRunner:
    """Runs Slurm commands for a client: ``env`` (laid over ``os.environ``) for every command, the retry
    ``policy``, and the ``sleep``/``clock`` its backoff uses."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        runner: Runner | None = None,
        policy: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.env: dict[str, str] = {**os.environ, **(env or {})}
        self.runner: Runner = runner or subprocess_runner
        self.policy = policy or RetryPolicy()
        self._sleep = sleep
        self._clock = clock

    def clock(self) -> float:
        return self._clock()

    def _attempt(self, argv: Sequence[str], input_text: str | None, timeout: float, idempotent: bool,
                 env: Mapping[str, str] | None = None) -> RunResult:  # fmt: skip
        try:
            result = self.runner(argv, input_text=input_text, timeout=timeout, env=dict(env or self.env))
        except FileNotFoundError:
            raise SlurmCommandMissing(argv[0]) from None
        except subprocess.TimeoutExpired:
            failure, result = Failure.MAYBE_SENT, RunResult(-1, "", f"timed out after {timeout:.0f} s")
        else:
            if result.returncode == 0:
                return result
            failure = classify_failure(result.returncode, result.stderr + "\n" + result.stdout)
        message = result.stderr.strip() or result.stdout.strip()
        if failure in (Failure.NOT_SENT, Failure.MAYBE_SENT):
            if should_retry(failure, idempotent):
                raise _Transient(argv, message)
            raise SlurmUnreachable(argv, message + " (the request may or may not have been applied)")
        if failure is Failure.UNKNOWN_JOB:
            raise UnknownJob(argv, result.returncode, message)
        if failure is Failure.ACCOUNTING_DISABLED:
            raise AccountingUnavailable(argv, message)
        raise SlurmCommandError(argv, result.returncode, message)

    def run(
        self, argv: Sequence[str], *, input_text: str | None = None, idempotent: bool = True,
        deadline: float | None = None, env: Mapping[str, str] | None = None,
    ) -> RunResult:
        """Run a Slurm command with retries; return its result when it exits 0, else raise a typed error.

        ``deadline`` (a ``clock()`` time) caps the policy's budget, so a query made of several commands stays
        within one budget."""
        if not argv or any(not isinstance(a, str) or "\0" in a for a in argv):
            raise SlurmUsageError(f"bad argument list {argv!r}", "pass a list of strings without NUL bytes")
        policy = self.policy
        start = self._clock()
        deadline = start + policy.budget_s if deadline is None else min(deadline, start + policy.budget_s)

        def attempt() -> RunResult:
            left = deadline - self._clock()
            timeout = policy.call_timeout_s if policy.budget_s == 0 else max(1.0, min(policy.call_timeout_s, left))
            return self._attempt(argv, input_text, timeout, idempotent, env)

        def stop(state: tenacity.RetryCallState) -> bool:
            return self._clock() + policy.backoff(state.attempt_number) > deadline

        retrying = tenacity.Retrying(
            retry=tenacity.retry_if_exception_type(_Transient),
            stop=stop,
            wait=lambda state: policy.backoff(state.attempt_number),
            sleep=self._sleep,
            reraise=True,
        )
        try:
            return retrying(attempt)
        except _Transient as exc:
            attempts = retrying.statistics.get("attempt_number", 1)
            raise SlurmUnreachable(exc.argv, exc.detail, attempts=attempts) from None

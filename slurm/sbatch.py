"""Batch scripts and sbatch flags: render a script from directives, and police pass-through flags.

Pure functions: the submission side (``supervise submit``) composes them; nothing here runs Slurm.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from slurm.errors import SlurmUsageError

# A Slurm job name that no directive, filename pattern, log line or shell reads differently.
JOB_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

# A path that sbatch directives, Slurm filename patterns (%j...) and the shell all read the same way.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+@:=,-]+$")


class SbatchFlagError(ValueError):
    """A pass-through sbatch flag conflicts with one the caller owns, or is not supported."""


def option_name(token: str) -> str | None:
    """The option a command-line token names (``--nodes=2`` -> ``--nodes``, ``-oX`` -> ``-o``), or None for values."""
    if token.startswith("--"):
        return token.split("=", 1)[0]
    if token.startswith("-") and len(token) >= 2 and not token[1].isdigit():
        return token[:2]
    return None


def has_option(flags: Sequence[str], *names: str) -> bool:
    return any(option_name(tok) in names for tok in flags)


def check_safe_path(path: str, what: str) -> None:
    """Reject paths that a directive, a filename pattern or the shell would read differently."""
    if not _SAFE_PATH.match(path) or "%" in path:
        raise SbatchFlagError(
            f"{what} {path!r} contains characters Slurm or the shell would misread (spaces, quotes, %, $...)"
        )


def check_directive(directive: str) -> None:
    """Reject a directive a batch script could not hold as one ``#SBATCH`` line.

    A newline in a value would end the comment and run the rest as a shell line (issue 10, finding 4), so
    no control character is allowed anywhere; a job name must match ``[A-Za-z0-9._-]{1,128}``.
    """
    if _CONTROL.search(directive):
        raise SbatchFlagError(f"#SBATCH directive {directive!r} contains a control character (newline, tab...)")
    name, _, value = directive.partition("=")
    if directive.startswith("-J") and name != "-J":  # short form: -Jname
        name, value = "-J", directive[2:]
    if name in ("--job-name", "-J") and not JOB_NAME.fullmatch(value):
        raise SbatchFlagError(f"job name {value!r} is not allowed: use 1 to 128 of A-Z a-z 0-9 . _ -")


def render_script(directives: Sequence[str], body: Sequence[Sequence[str]], header: Sequence[str] = ()) -> str:
    """A bash batch script: ``#SBATCH`` directives, then one command per body entry, each word shell-quoted.

    Every directive and header line is checked first (``check_directive``): nothing from input can become a
    shell line. Raises SbatchFlagError.
    """
    for directive in directives:
        check_directive(directive)
    for line in header:
        if _CONTROL.search(line):
            raise SbatchFlagError(f"batch script comment {line!r} contains a control character")
    lines = ["#!/bin/bash"]
    lines += [f"# {line}" if line else "#" for line in header]
    lines += [f"#SBATCH {d}" for d in directives]
    lines += [shlex.join(cmd) for cmd in body]
    return "\n".join(lines) + "\n"


SBATCH_FLAGS_WITHOUT_SEPARATE_VALUE = frozenset(
    {
        "-h", "-H", "-I", "-k", "-O", "-Q", "-s", "-v", "-V", "-W", "--help", "--usage", "--hold", "--overcommit",
        "--quiet", "--oversubscribe", "--verbose", "--version", "--wait", "--contiguous", "--exclusive",
        "--requeue", "--no-requeue", "--parsable", "--test-only", "--use-min-nodes", "--spread-job",
        "--ignore-pbs", "--no-kill", "--immediate", "--get-user-env", "--propagate", "--nice", "--reboot",
        "--kill-on-invalid-dep",
    }
)  # fmt: skip
"""sbatch flags with no argument or an optional one (which must be attached with '='): a bare word after
them would be read as the script path."""


def check_sbatch_options(options: Sequence[str]) -> None:
    """Options only: a bare word may follow a flag that takes a separate value (``-N 2``, ``--time 5``),
    nowhere else, because sbatch would take it for the script path and ignore the script on stdin."""
    previous = ""
    for opt in options:
        if not isinstance(opt, str) or "\0" in opt or not opt:
            raise SlurmUsageError(f"invalid sbatch option {opt!r}", "pass options as '--flag=value' or '-f value'")
        if opt.startswith("-"):
            previous = opt
            continue
        takes_value = (
            previous.startswith("--") and "=" not in previous or len(previous) == 2 and previous[0] == "-"
        ) and previous not in SBATCH_FLAGS_WITHOUT_SEPARATE_VALUE
        if not takes_value:
            raise SlurmUsageError(
                f"unexpected bare argument {opt!r} among the sbatch options",
                "pass options as '--flag=value' or '-f value'; the batch script is generated, not given",
            )
        previous = ""

"""Batch scripts and sbatch flags: render a script from directives, and police pass-through flags.

Pure functions: the submission side (``supervise submit``) composes them; nothing here runs Slurm.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Sequence

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


def find_conflicts(flags: Sequence[str], owned: Iterable[str]) -> list[str]:
    """Flags (as given) whose option is in ``owned`` (long or short spellings)."""
    owned_set = set(owned)
    return [tok for tok in flags if option_name(tok) in owned_set]


def has_option(flags: Sequence[str], *names: str) -> bool:
    return any(option_name(tok) in names for tok in flags)


def check_safe_path(path: str, what: str) -> None:
    """Reject paths that a directive, a filename pattern or the shell would read differently."""
    if not _SAFE_PATH.match(path) or "%" in path:
        raise SbatchFlagError(
            f"{what} {path!r} contains characters Slurm or the shell would misread (spaces, quotes, %, $...)"
        )


def render_script(directives: Sequence[str], body: Sequence[Sequence[str]], header: Sequence[str] = ()) -> str:
    """A bash batch script: ``#SBATCH`` directives, then one command per body entry, each word shell-quoted."""
    lines = ["#!/bin/bash"]
    lines += [f"# {line}" if line else "#" for line in header]
    lines += [f"#SBATCH {d}" for d in directives]
    lines += [shlex.join(cmd) for cmd in body]
    return "\n".join(lines) + "\n"

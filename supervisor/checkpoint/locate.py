"""Where a campaign's checkpoints live, so a relaunch resumes without any configuration.

Why guess from the training command: the README's own usage (``supervise submit ... -- python train.py
--ckpt-dir /scratch/ckpt``) names the directory only in the training argv. Without it the supervisor
cannot pick a checkpoint, and every relaunch would start from step 0. The order of precedence is
``supervise submit --checkpoint-dir DIR``, then ``[run] checkpoint_dir``, then the training argv's usual
flags. Pure functions: no filesystem access.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

# Flags that name a checkpoint directory in common training programs, most specific first: the
# example and most scripts (--ckpt-dir), Megatron (--save), Lightning (--default-root-dir), HF
# Trainer (--output-dir / --output_dir). Both ``--flag value`` and ``--flag=value`` are read.
DIR_FLAGS: tuple[str, ...] = (
    "--ckpt-dir", "--ckpt_dir", "--checkpoint-dir", "--checkpoint_dir", "--save",
    "--default-root-dir", "--default_root_dir", "--output-dir", "--output_dir",
)
# Hydra/Lightning-CLI style ``key=value`` arguments naming a checkpoint file or directory.
KEY_ARGS: tuple[str, ...] = ("ckpt_path", "checkpoint_dir", "ckpt_dir")
# A value naming a checkpoint *file*: its directory is the checkpoint root.
FILE_SUFFIXES: tuple[str, ...] = (".ckpt", ".pt", ".pth", ".bin", ".safetensors")
# Values that are keywords, not paths (Lightning's ckpt_path="last", Hydra's null).
NOT_PATHS = frozenset({"", "last", "best", "hpc", "registry", "null", "none", "None", "~"})


def _dir_of(value: str) -> str | None:
    value = value.strip()
    if value in NOT_PATHS or "\x00" in value:
        return None
    if value.lower().endswith(FILE_SUFFIXES):
        parent = posixpath.dirname(value.rstrip("/"))
        return parent or "."
    return value


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


def shell_command(argv: Sequence[str]) -> list[str] | None:
    """The words of the command string a shell is given with ``-c`` (``bash -c "torchrun ... --ckpt-dir X"``,
    ``bash -lc ...``), or None: not a shell, no ``-c``, or a string ``shlex`` cannot split."""
    import shlex

    if not argv or posixpath.basename(argv[0]) not in SHELLS:
        return None
    for i, tok in enumerate(argv[1:], start=1):
        if not tok.startswith("-"):
            return None  # a script file: its flags are its own
        if tok.startswith("-") and not tok.startswith("--") and "c" in tok[1:] and i + 1 < len(argv):
            try:
                return shlex.split(argv[i + 1], comments=True)
            except ValueError:
                return None
    return None


def checkpoint_dir_from_argv(argv: Sequence[str]) -> str | None:
    """The checkpoint directory a training command names, or None.

    When a flag is given more than once the last one counts (as argparse does); between different
    flags the order of ``DIR_FLAGS`` then ``KEY_ARGS`` decides. Everything after a bare ``--`` is
    positional and ignored. A shell's ``-c`` string is read as the command it runs.
    """
    inner = shell_command(argv)
    if inner is not None:
        return checkpoint_dir_from_argv(inner)
    found: dict[str, str] = {}
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "--":
            break
        name, eq, value = tok.partition("=")
        if name in DIR_FLAGS:
            if eq:
                found[name] = value
            elif i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                found[name] = tokens[i + 1]
                i += 1
        elif eq and name.lstrip("+") in KEY_ARGS:  # Hydra's "+key=value" appends a key
            found[name.lstrip("+")] = value
        i += 1
    for name in (*DIR_FLAGS, *KEY_ARGS):
        if name in found:
            directory = _dir_of(found[name])
            if directory is not None:
                return directory
    return None


def resolve_checkpoint_dir(explicit: str | None, configured: str, argv: Sequence[str], cwd: str) -> str:
    """The absolute checkpoint directory of a campaign, or "" when nothing names one.

    Relative paths are taken from ``cwd``: the training runs there (the campaign's working directory).
    """
    for candidate in (explicit, configured or None, checkpoint_dir_from_argv(argv)):
        if candidate:
            return posixpath.normpath(posixpath.join(cwd, candidate))
    return ""


def parse_declaration(text: str) -> str | None:
    """The directory a program declared (``client.saves_to``: ``{"path": "/abs/dir", ...}``), normalised; None for
    anything else (not JSON, not absolute, a NUL or newline, longer than 4096 bytes). Never raises: the file is the
    program's text."""
    import json

    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        return None
    path = doc.get("path") if isinstance(doc, dict) else None
    if not isinstance(path, str) or not path.startswith("/") or "\x00" in path or "\n" in path:
        return None
    if len(path.encode(errors="replace")) > 4096:
        return None
    return posixpath.normpath(path)


RESUME_OFF_HINT = ("resume is off until the program says where it saves (CheckpointSaver does; a script of your own "
                   "calls client.saves_to(DIR)): the supervisor cannot hand a relaunch a validated checkpoint "
                   "before that (SUPERVISOR_RESUME_FROM stays unset); to turn it on now pass --checkpoint-dir DIR "
                   "or set [run] checkpoint_dir")

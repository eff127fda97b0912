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


def checkpoint_dir_from_argv(argv: Sequence[str]) -> str | None:
    """The checkpoint directory a training command names, or None.

    When a flag is given more than once the last one counts (as argparse does); between different
    flags the order of ``DIR_FLAGS`` then ``KEY_ARGS`` decides. Everything after a bare ``--`` is
    positional and ignored.
    """
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


RESUME_OFF_HINT = ("resume is off: the supervisor does not know where checkpoints are, so it cannot hand a "
                   "relaunch a validated checkpoint (SUPERVISOR_RESUME_FROM stays unset); to turn it on pass "
                   "--checkpoint-dir DIR or set [run] checkpoint_dir")

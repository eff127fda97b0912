"""``supervise checkpoints DIR``: placeholder until the checkpoint store lands (issue 4)."""

from __future__ import annotations

import argparse

from supervisor.errors import CheckpointError

HELP = "list and verify checkpoints in a directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir")


def run(args: argparse.Namespace) -> int:
    raise CheckpointError("the checkpoint store is not built yet", "see issue 4")

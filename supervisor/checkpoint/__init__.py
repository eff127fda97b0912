"""Checkpoints that are valid only once fully durable, and a store that finds the newest valid one.

Layout of a checkpoint root (see docs/checkpoints.md)::

    ROOT/step_000000100/            a committed checkpoint: shard files + ``manifest.json``
    ROOT/.incomplete-step_.../      a save in progress, or left by a crash: never chosen
    ROOT/quarantine/<name>-<time>/  checkpoints moved aside as invalid, with ``QUARANTINE_REASON.txt``
    ROOT/LATEST                     the newest committed name, updated only after the commit

Only ``commit.py`` (training side) may import torch, lazily; everything else here must import
without torch, because the supervisor validates checkpoints and never imports torch.
"""

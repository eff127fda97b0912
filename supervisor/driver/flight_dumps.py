"""The flight recorder's dumps of a launch: where torch writes them, and which rank they name.

Every launch's ranks are told (``distenv.flight_recorder_env``) to keep PyTorch's flight recorder and, on an NCCL
collective timeout, to dump it to ``<launch log>.fr/rank_<RANK>`` (a 0700 directory of the attempt's logs). At the
launch's ending the supervisor reads what is there (the program's own files: untrusted; regular files only, no
symlink followed, 64 MiB each at most, a corrupt one skipped) and, when the dumps show ranks waiting inside a
collective for a rank that never enqueued it (``decisions/flight_recorder.py``), adds a ``rank_hang`` detection
naming that rank and its node to the ending's evidence, timed when the first dump was written.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

import structlog

from supervisor.decisions import flight_recorder as fr
from supervisor.decisions.detect.findings import RANK_HANG, DetectionEvent

log = structlog.get_logger("supervisor")

PREFIX = "rank_"  # torch appends the rank
_NAME = re.compile(rf"{PREFIX}([0-9]{{1,7}})(?:\.(?:json|pickle|pkl))?")
MAX_FILES = 65_536


def dump_dir(log_path: Path) -> Path:
    """The launch's dump directory, next to its log."""
    return log_path.with_suffix(".fr")


def read_dumps(directory: Path) -> tuple[dict[int, fr.Dump], float | None]:
    """(rank -> its dump, when the first was written); ({}, None) when there are none."""
    dumps: dict[int, fr.Dump] = {}
    first: float | None = None
    try:
        names = sorted(os.listdir(directory))[:MAX_FILES]
    except OSError:
        return {}, None
    for name in names:
        m = _NAME.fullmatch(name)
        if m is None:
            continue
        try:
            fd = os.open(directory / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size > fr.MAX_DUMP_BYTES:
                continue
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(fr.MAX_DUMP_BYTES + 1)
            dumps[int(m.group(1))] = fr.parse_dump(data)
            first = info.st_mtime if first is None else min(first, info.st_mtime)
        except (OSError, fr.FlightRecorderError) as err:
            log.warning("flight_recorder_dump_unreadable", file=name, error=str(err)[:200])
        finally:
            os.close(fd)
    return dumps, first


def lag_detection(directory: Path, nodes_in_rank_order: Sequence[str], tasks_per_node: int
                  ) -> tuple[float, DetectionEvent] | None:  # fmt: skip
    """(when, ``rank_hang``) for the ranks the dumps show the others waiting for; None when they name nobody."""
    dumps, first = read_dumps(directory)
    lag = fr.lagging(dumps) if dumps else None
    if lag is None or first is None:
        return None
    per_node = max(1, tasks_per_node)
    nodes = sorted({nodes_in_rank_order[r // per_node] for r in lag.ranks if 0 <= r // per_node < len(
        nodes_in_rank_order)})  # fmt: skip
    evidence = (*lag.evidence, f"flight recorder dumps of {len(dumps)} rank(s) in {directory}")
    return first, DetectionEvent(RANK_HANG, lag.ranks, tuple(nodes), "flight_recorder", None, None, None, evidence)

"""``live.json``: the live table as a small private JSON file that ``supervise status`` reads.

Why a file: ``status`` must never talk to the job or need the secret, and must be cheap in a ``watch`` loop;
the supervisor rewrites the file atomically about once a second.  A 131k-rank job still writes a small file:
beyond the row limits only the worst rows (abnormal states, oldest beats, stalest nodes) are kept.
"""

from __future__ import annotations

import heapq
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from supervisor.heartbeat.table import ABNORMAL_NAMES, RankView, Snapshot

LIVE_SCHEMA = 1


def _num(x: float | None, digits: int = 3) -> float | None:
    """JSON-safe number: NaN/Inf become strings would break readers, so they become None (loss keeps text)."""
    if x is None or not math.isfinite(x):
        return None
    return round(x, digits)


def _worst(items: list[Any], limit: int, abnormal: Callable[[Any], bool], age: Callable[[Any], float]) -> list[Any]:
    """Everything if it fits, else abnormal items first, then the oldest."""
    if len(items) <= limit:
        return items
    bad = [x for x in items if abnormal(x)]
    if len(bad) >= limit:
        return heapq.nlargest(limit, bad, key=age)
    good = [x for x in items if not abnormal(x)]
    return bad + heapq.nlargest(limit - len(bad), good, key=age)


def worst_ranks(ranks: list[RankView], limit: int) -> list[RankView]:
    return _worst(ranks, limit, lambda r: r.state in ABNORMAL_NAMES, lambda r: r.beat_age_s or 0.0)


def live_document(snap: Snapshot, *, max_rank_rows: int = 4096, max_node_rows: int = 2048,
                  selected: list[RankView] | None = None) -> dict[str, Any]:
    """The ``live.json`` content: every rank and node up to the row limits, beyond them the worst first
    (abnormal states, oldest beats, stalest nodes), so a 131k-rank job still writes a small file that
    shows what matters.  ``selected``: the rank rows, if already chosen with ``worst_ranks``."""
    ranks = worst_ranks(snap.ranks, max_rank_rows) if selected is None else selected
    nodes = _worst(list(snap.nodes.values()), max_node_rows, lambda n: False, lambda n: n.staleness_s)
    rows = []
    for r in sorted(ranks, key=lambda r: r.rank):
        d = r._asdict()
        for k in ("beat_age_s", "steps_per_s", "ewma_steps_per_s", "ewma_s", "min_s", "max_s", "cpu_s", "cpu_frac",
                  "own_s"):
            d[k] = _num(d[k])
        d["loss"] = None if r.loss is None else _num(r.loss, 6) if math.isfinite(r.loss) else repr(r.loss)
        rows.append(d)
    return {
        "schema": LIVE_SCHEMA, "job": snap.job, "written_wall": snap.taken_wall,
        "nodes_total": len(snap.nodes),
        "nodes": [{"node": n.node, "staleness_s": _num(n.staleness_s), "ranks": n.rank_count, "frames": n.frames,
                   "seq": n.seq, "lag_s": _num(n.lag_s), "addr": n.addr} for n in sorted(nodes, key=lambda n: n.node)],
        "ranks_total": len(snap.ranks), "ranks": rows, "counters": snap.counters, "events": snap.events[-50:],
    }


def write_private_json(path: Path, doc: dict[str, Any]) -> None:
    """Atomically replace ``path`` with ``doc`` (0600).  No fsync: a live view, rewritten every second."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps(doc, separators=(",", ":"), allow_nan=False))  # one C-encoder pass, one write
    os.replace(tmp, path)

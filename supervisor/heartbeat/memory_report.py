"""What a node's memory store holds, as one authenticated agent event (``wire.EVENT_MEMORY``).

The text is a small JSON document, ``{"held": [[step, rank, world, digest, verified, launch], ...], "more": n,
"listen": "host:port", "off": [[rank, errno], ...]}`` (``listen``: where the agent receives shards from other
agents, "" when it does not; ``off``: the node's ranks that turned their snapshots off because the store failed
them, with the OS error, e.g. ENOSPC: /dev/shm too small; both keys optional),
newest steps first, cut to fit one event (``wire.MAX_TEXT``; ``more`` counts what was left out: the oldest, which
a restore would pick last). Digests travel as their first 32 hex digits (128 bits: enough to tell two copies of
a shard apart, and twice the shards per event). The whole inventory is sent each time, so a lost datagram is
superseded by the next. Parsing is total: anything not exactly this shape raises ``wire.FrameError("memory")``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import NamedTuple

from supervisor.decisions.memory_pick import Held
from supervisor.heartbeat.wire import MAX_TEXT, FrameError

DIGEST_CHARS = 32
MAX_LAUNCH = 64
MAX_HELD = 256
MAX_LISTEN = 300
MAX_OFF = 64
_HEX = frozenset("0123456789abcdef")


class MemoryReport(NamedTuple):
    held: tuple[Held, ...]
    listen: str  # where the agent receives shards from other agents ("": nowhere)
    off: tuple[tuple[int, int], ...]  # (rank, errno) of the ranks whose snapshots the store failed


def encode_memory(held: Sequence[Held], listen: str = "", off: Sequence[tuple[int, int]] = ()) -> str:
    """The event text: the newest steps first, as many shards as fit."""
    rows = [[h.step, h.rank, h.world, h.digest[:DIGEST_CHARS], int(h.verified), h.launch[:MAX_LAUNCH]]
            for h in sorted(held, key=lambda h: (-h.step, h.rank))][:MAX_HELD]  # fmt: skip
    total = len(held)
    failed = [[rank, errno] for rank, errno in sorted(off)[:MAX_OFF]]
    while True:
        doc: dict[str, object] = {"held": rows, "more": total - len(rows), "listen": listen[:MAX_LISTEN]}
        if failed:
            doc["off"] = failed
        text = json.dumps(doc, separators=(",", ":"))
        if len(text.encode()) <= MAX_TEXT or not rows:
            return text
        # cut a tenth at a time (at least one row): a full inventory fits in a few tries
        del rows[len(rows) - max(1, len(rows) // 10):]


def parse_memory(text: str) -> tuple[Held, ...]:
    """Parse an EVENT_MEMORY text into the shards it lists."""
    return parse_memory_report(text)[0]


def parse_memory_report(text: str) -> MemoryReport:
    """Parse an EVENT_MEMORY text: the shards it lists, the agent's shard-receiving address, the failed ranks."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise FrameError("memory") from None
    if not isinstance(doc, dict) or set(doc) - {"listen", "off"} != {"held", "more"}:
        raise FrameError("memory")
    rows, more, listen = doc["held"], doc["more"], doc.get("listen", "")
    off = _off(doc.get("off", []))
    if not isinstance(listen, str) or len(listen) > MAX_LISTEN or listen and not _hostport(listen):
        raise FrameError("memory")
    if not isinstance(rows, list) or len(rows) > MAX_HELD or type(more) is not int or not 0 <= more <= 1 << 30:
        raise FrameError("memory")
    out = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 6:
            raise FrameError("memory")
        step, rank, world, digest, verified, launch = row
        if not all(type(x) is int for x in (step, rank, world, verified)):
            raise FrameError("memory")
        if not (0 <= step < 1 << 62 and 0 <= rank < world <= 1 << 24 and verified in (0, 1)):
            raise FrameError("memory")
        if not isinstance(digest, str) or len(digest) != DIGEST_CHARS or not set(digest) <= _HEX:
            raise FrameError("memory")
        if not isinstance(launch, str) or len(launch) > MAX_LAUNCH:
            raise FrameError("memory")
        out.append(Held(step, rank, world, digest, bool(verified), launch))
    return MemoryReport(tuple(out), listen, off)


def _off(rows: object) -> tuple[tuple[int, int], ...]:
    if not isinstance(rows, list) or len(rows) > MAX_OFF:
        raise FrameError("memory")
    out = []
    for row in rows:
        if not isinstance(row, list) or len(row) != 2 or not all(type(x) is int for x in row):
            raise FrameError("memory")
        if not (0 <= row[0] < 1 << 24 and 0 <= row[1] < 4096):
            raise FrameError("memory")
        out.append((row[0], row[1]))
    return tuple(out)


def _hostport(text: str) -> bool:
    host, sep, port = text.rpartition(":")
    return bool(sep and host and port.isdigit() and 0 < int(port) < 65536)

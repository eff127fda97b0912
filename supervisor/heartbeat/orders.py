"""The supervisor's JSON orders to a node agent (``wire.KIND_ORDER``, authenticated like every frame): the memory
tier's buddy (where this node's new shards are copied) and shard copies before a relaunch (``fetch``: send
``rank``'s shard of ``step`` to the node it will run on). Parsing is total: anything not exactly this shape raises
:class:`OrderError` and is counted, never obeyed."""

from __future__ import annotations

import json
from dataclasses import dataclass


class OrderError(ValueError):
    """An authenticated order whose text is not one of ours."""


@dataclass(frozen=True)
class Peer:
    node: str
    host: str
    port: int


@dataclass(frozen=True)
class Fetch:
    to: Peer
    step: int
    rank: int


@dataclass(frozen=True)
class Orders:
    buddy: Peer | None = None  # None: the key was absent (no change); see ``no_buddy``
    no_buddy: bool = False  # "buddy": null: stop copying (a ring of one)
    fetches: tuple[Fetch, ...] = ()


def _peer(doc: object) -> Peer:
    if not isinstance(doc, dict) or set(doc) != {"node", "address"}:
        raise OrderError("peer")
    node, address = doc["node"], doc["address"]
    if not isinstance(node, str) or not 0 < len(node) <= 255 or not isinstance(address, str):
        raise OrderError("peer")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise OrderError("peer address")
    return Peer(node, host.strip("[]"), int(port))


def parse_orders(text: str) -> Orders:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise OrderError("json") from None
    if not isinstance(doc, dict) or not doc or set(doc) - {"buddy", "fetch"}:
        raise OrderError("keys")
    buddy, no_buddy = None, False
    if "buddy" in doc:
        if doc["buddy"] is None:
            no_buddy = True
        else:
            buddy = _peer(doc["buddy"])
    fetches = []
    raw = doc.get("fetch", [])
    if not isinstance(raw, list) or len(raw) > 4096:
        raise OrderError("fetch")
    for item in raw:
        if not isinstance(item, dict) or set(item) != {"to", "step", "rank"}:
            raise OrderError("fetch")
        step, rank = item["step"], item["rank"]
        if type(step) is not int or type(rank) is not int or not (0 <= step < 1 << 62 and 0 <= rank < 1 << 24):
            raise OrderError("fetch")
        fetches.append(Fetch(_peer(item["to"]), step, rank))
    return Orders(buddy, no_buddy, tuple(fetches))


def buddy_order(node: str, address: str) -> str:
    return json.dumps({"buddy": {"node": node, "address": address}}, separators=(",", ":"))


def fetch_order(items: list[tuple[str, str, int, int]]) -> str:
    """(to node, its address, step, rank) for each shard to send."""
    return json.dumps({"fetch": [{"to": {"node": n, "address": a}, "step": s, "rank": r} for n, a, s, r in items]},
                      separators=(",", ":"))  # fmt: skip

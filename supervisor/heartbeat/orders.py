"""The supervisor's JSON orders to a node agent (``wire.KIND_ORDER``, authenticated like every frame): the memory
tier's buddy (where this node's new shards are copied) and shard copies before a relaunch (``fetch``: send
``rank``'s shard of ``step`` to the node it will run on), the flush of a snapshot to the filesystem before the
job stops (``flush``: copy these shards into that directory), and the restart order for ranks restarting in their
processes (``restart``: the generation and the variables it changes, written into the slot directory as
``client.restart_order`` reads it), and a standby rank's assignment (``assign``: the rank it takes over,
``client.standby``). Parsing is total: anything not exactly this shape raises
:class:`OrderError` and is counted, never obeyed."""

from __future__ import annotations

import json
from dataclasses import dataclass

from supervisor.client import restart_order


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
class FlushShard:
    step: int
    rank: int
    launch: str  # the launch that wrote it: a step written again by a relaunch is another snapshot


@dataclass(frozen=True)
class Flush:
    directory: str  # absolute; the supervisor's private staging directory on the shared filesystem
    shards: tuple[FlushShard, ...]
    background: bool = False  # a periodic persist while the training runs, not the copy before the job stops


@dataclass(frozen=True)
class Orders:
    buddy: Peer | None = None  # None: the key was absent (no change); see ``no_buddy``
    no_buddy: bool = False  # "buddy": null: stop copying (a ring of one)
    fetches: tuple[Fetch, ...] = ()
    flush: Flush | None = None
    restart: restart_order.RestartOrder | None = None
    assign: tuple[str, restart_order.RestartOrder] | None = None  # (standby id, its assignment)


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
    if not isinstance(doc, dict) or not doc or set(doc) - {"buddy", "fetch", "flush", "restart", "assign"}:
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
        if not _step_rank(step, rank):
            raise OrderError("fetch")
        fetches.append(Fetch(_peer(item["to"]), step, rank))
    return Orders(buddy, no_buddy, tuple(fetches), _flush(doc["flush"]) if "flush" in doc else None,
                  _restart(doc["restart"]) if "restart" in doc else None,
                  _assign(doc["assign"]) if "assign" in doc else None)  # fmt: skip


def _assign(doc: object) -> tuple[str, restart_order.RestartOrder]:
    """A standby's assignment: its id (a file name part) and the order, the rank's identity allowed."""
    if not isinstance(doc, dict) or set(doc) != {"standby", "generation", "env"}:
        raise OrderError("assign")
    standby = doc["standby"]
    if not isinstance(standby, str) or not 0 < len(standby) <= 64 or \
            not standby.replace("-", "").replace("_", "").isalnum() or not standby.isascii():  # fmt: skip
        raise OrderError("assign standby")
    try:
        order = restart_order.parse_order(json.dumps({"v": restart_order.ORDER_VERSION, "generation": doc["generation"],
                                                      "env": doc["env"]}).encode(), restart_order.ASSIGN_ENV)  # fmt: skip
    except restart_order.OrderError:
        raise OrderError("assign") from None
    return standby, order


def _restart(doc: object) -> restart_order.RestartOrder:
    """The restart order, checked by the rank side's own parser (the file the agent writes is what it accepts)."""
    if not isinstance(doc, dict) or set(doc) != {"generation", "env"}:
        raise OrderError("restart")
    try:
        return restart_order.parse_order(json.dumps({"v": restart_order.ORDER_VERSION, **doc}).encode())
    except restart_order.OrderError:
        raise OrderError("restart") from None


def _step_rank(step: object, rank: object) -> bool:
    return type(step) is int and type(rank) is int and 0 <= step < 1 << 62 and 0 <= rank < 1 << 24


def _flush(doc: object) -> Flush:
    if not isinstance(doc, dict) or not {"dir", "shards"} <= set(doc) <= {"dir", "shards", "background"}:
        raise OrderError("flush")
    background = doc.get("background", False)
    if type(background) is not bool:
        raise OrderError("flush background")
    directory, raw = doc["dir"], doc["shards"]
    if not isinstance(directory, str) or not directory.startswith("/") or "\0" in directory or \
            len(directory) > 4096 or "/../" in f"{directory}/":  # fmt: skip
        raise OrderError("flush dir")
    if not isinstance(raw, list) or not 0 < len(raw) <= 4096:
        raise OrderError("flush shards")
    shards = []
    for item in raw:
        if not isinstance(item, dict) or set(item) != {"step", "rank", "launch"}:
            raise OrderError("flush shards")
        step, rank, launch = item["step"], item["rank"], item["launch"]
        if not _step_rank(step, rank) or not isinstance(launch, str) or len(launch) > 64:
            raise OrderError("flush shards")
        shards.append(FlushShard(step, rank, launch))
    return Flush(directory, tuple(shards), background)


def buddy_order(node: str, address: str) -> str:
    return json.dumps({"buddy": {"node": node, "address": address}}, separators=(",", ":"))


def fetch_order(items: list[tuple[str, str, int, int]]) -> str:
    """(to node, its address, step, rank) for each shard to send."""
    return json.dumps({"fetch": [{"to": {"node": n, "address": a}, "step": s, "rank": r} for n, a, s, r in items]},
                      separators=(",", ":"))  # fmt: skip


def flush_order(directory: str, shards: list[tuple[int, int, str]], background: bool = False) -> str:
    """(step, rank, launch) of each shard this node copies into ``directory``; ``background``: a periodic persist
    (``driver.memory_persist``), which the agent neither waits for at its SIGTERM nor puts before a stop's flush."""
    doc: dict[str, object] = {"dir": directory, "shards": [{"step": s, "rank": r, "launch": launch}
                                                           for s, r, launch in shards]}  # fmt: skip
    if background:
        doc["background"] = True
    return json.dumps({"flush": doc}, separators=(",", ":"))


def restart_order_text(order: restart_order.RestartOrder) -> str:
    return json.dumps({"restart": {"generation": order.generation, "env": order.env}}, separators=(",", ":"))


def assign_order_text(standby: str, order: restart_order.RestartOrder) -> str:
    return json.dumps({"assign": {"standby": standby, "generation": order.generation, "env": order.env}},
                      separators=(",", ":"))  # fmt: skip

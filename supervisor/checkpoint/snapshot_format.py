"""The memory tier's shard file: one rank's state at one step, in a format the supervisor side can check without
torch and without unpickling anything. Pure bytes in and out.

Layout: ``MAGIC`` (8 bytes), the header's length (8 bytes, little-endian), the header (UTF-8 JSON), then the
payload: every tensor's bytes, each at a 64-byte aligned offset. The header says the step, rank and world size,
and each leaf of the state: its path through the nested dicts/lists (``["k", name]`` a string key, ``["n", 3]``
an integer key, ``["i", 0]`` a list index), and either a tensor (dtype, shape, offset, length, whether it was a
DTensor's local shard) or a plain JSON value (int, float, bool, string, null). The rank that wrote it records the
file's SHA-256 next to it (``rank_R.json``); the agent re-reads the bytes against it before offering the shard.

Why not torch.save: its files are pickles; the node agent, which moves and verifies shards between nodes, must
never unpickle (docs/security.md), and a rank reading its own shard back should not either.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

MAGIC = b"SUPSNAP1"
ALIGN = 64
MAX_HEADER = 64 << 20  # a header this big is not one we wrote
DTYPES = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
          "complex64", "complex128")  # fmt: skip
PathPart = tuple[str, Any]


class SnapshotFormatError(ValueError):
    """The bytes are not a shard file this project wrote (truncated, altered, or something else)."""


@dataclass(frozen=True)
class TensorLeaf:
    path: tuple[PathPart, ...]
    dtype: str
    shape: tuple[int, ...]
    offset: int  # from the payload's start
    nbytes: int
    dtensor: bool = False  # the local shard of a DTensor (restored into the target's local tensor)


@dataclass(frozen=True)
class ValueLeaf:
    path: tuple[PathPart, ...]
    value: Any


@dataclass(frozen=True)
class Header:
    step: int
    rank: int
    world: int
    leaves: tuple[TensorLeaf | ValueLeaf, ...]
    payload_bytes: int


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def encode_header(header: Header) -> bytes:
    """MAGIC, length and header JSON; the payload follows at ``payload_start(len(result))``."""
    leaves = []
    for leaf in header.leaves:
        path = [list(p) for p in leaf.path]
        if isinstance(leaf, TensorLeaf):
            leaves.append({"path": path, "dtype": leaf.dtype, "shape": list(leaf.shape), "offset": leaf.offset,
                           "nbytes": leaf.nbytes, "dtensor": leaf.dtensor})  # fmt: skip
        else:
            leaves.append({"path": path, "value": leaf.value})
    body = json.dumps({"step": header.step, "rank": header.rank, "world": header.world, "leaves": leaves,
                       "payload_bytes": header.payload_bytes}, allow_nan=True, separators=(",", ":")).encode()  # fmt: skip
    head = MAGIC + struct.pack("<Q", len(body)) + body
    return head + b"\0" * (aligned(len(head)) - len(head))


def _int(doc: dict[str, Any], key: str, low: int = 0) -> int:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise SnapshotFormatError(f"header field {key!r} is not a whole number >= {low}: {value!r}")
    return value


def _path(raw: Any) -> tuple[PathPart, ...]:
    if not isinstance(raw, list) or not raw:
        raise SnapshotFormatError("a leaf without a path")
    parts: list[PathPart] = []
    for part in raw:
        if not (isinstance(part, list) and len(part) == 2 and part[0] in ("k", "n", "i")):
            raise SnapshotFormatError(f"a path part that is not [kind, key]: {part!r}")
        kind, key = part
        if kind == "k" and not isinstance(key, str):
            raise SnapshotFormatError(f"a string key that is not a string: {key!r}")
        if kind in ("n", "i") and (isinstance(key, bool) or not isinstance(key, int) or (kind == "i" and key < 0)):
            raise SnapshotFormatError(f"an integer key or index that is not one: {key!r}")
        parts.append((kind, key))
    return tuple(parts)


def parse_header(data: bytes | bytearray) -> tuple[Header, int]:
    """(the header, where the payload starts) from the first bytes of a shard file (all of it is fine). Raises
    only :class:`SnapshotFormatError`."""
    if len(data) < 16 or data[:8] != MAGIC:
        raise SnapshotFormatError("not a snapshot shard (no magic)")
    (length,) = struct.unpack("<Q", data[8:16])
    if length > MAX_HEADER or 16 + length > len(data):
        raise SnapshotFormatError(f"a header of {length} bytes in {len(data)} bytes: truncated or not ours")
    try:
        doc = json.loads(data[16 : 16 + length].decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as err:
        raise SnapshotFormatError(f"the header is not JSON: {err}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("leaves"), list):
        raise SnapshotFormatError("the header is not a snapshot header")
    world = _int(doc, "world", 1)
    rank, step, payload = _int(doc, "rank"), _int(doc, "step"), _int(doc, "payload_bytes")
    if rank >= world:
        raise SnapshotFormatError(f"rank {rank} of a world of {world}")
    leaves: list[TensorLeaf | ValueLeaf] = []
    for raw in doc["leaves"]:
        if not isinstance(raw, dict):
            raise SnapshotFormatError("a leaf that is not an object")
        path = _path(raw.get("path"))
        if "value" in raw:
            value = raw["value"]
            if not (value is None or isinstance(value, (bool, int, float, str))):
                raise SnapshotFormatError(f"a value leaf that is not a plain value: {type(value).__name__}")
            leaves.append(ValueLeaf(path, value))
            continue
        dtype, shape = raw.get("dtype"), raw.get("shape")
        if dtype not in DTYPES:
            raise SnapshotFormatError(f"an unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):  # fmt: skip
            raise SnapshotFormatError(f"a shape that is not a list of sizes: {shape!r}")
        offset, nbytes = _int(raw, "offset"), _int(raw, "nbytes")
        if offset % ALIGN or offset + nbytes > payload:
            raise SnapshotFormatError(f"a tensor at {offset}+{nbytes} outside the payload of {payload} bytes")
        leaves.append(TensorLeaf(path, dtype, tuple(shape), offset, nbytes, raw.get("dtensor") is True))
    start = aligned(16 + length)
    return Header(step, rank, world, tuple(leaves), payload), start


def check_size(header: Header, start: int, size: int) -> None:
    """A file of ``size`` bytes holds the whole payload its header promises (a truncated shard is refused)."""
    if size != start + header.payload_bytes:
        raise SnapshotFormatError(f"{size} bytes, the header promises {start + header.payload_bytes}: truncated "
                                  "or altered")  # fmt: skip


def path_text(path: Sequence[PathPart]) -> str:
    return "/".join(str(key) for _, key in path)

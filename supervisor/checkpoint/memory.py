"""Training side of the memory tier: each rank snapshots its own state (its shards, under FSDP2) into node-local
memory, and reads it back at a relaunch. torch is imported only when a snapshot is taken or read.

Where: ``$SUPERVISOR_MEMORY_DIR`` (a private directory the node agent made on /dev/shm, so a snapshot outlives the
rank that wrote it), ``step_<N>/rank_<R>.snap`` plus ``rank_<R>.json`` (step, rank, world, size, SHA-256). The
sidecar is written after the shard and renamed into place last: a shard without it does not exist. Each rank
keeps its ``keep`` newest steps.

What a save costs the training: the copy of every tensor into reused CPU buffers (``save`` returns then); the
file, its digest and the sidecar are written by one background thread. A second save first waits for the first.

Restore reads the rank's own file, checks its size and digest against the sidecar (a torn or altered shard is
refused: :class:`MemorySnapshotError`), and copies every tensor into the state dict it is given (a DTensor's local
shard into the target DTensor's), so ``get_state_dict``/``set_state_dict`` work as with DCP. The world size and
each tensor's shape must match: a snapshot is per rank; on another world size the filesystem tier reshards.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from supervisor.checkpoint.snapshot_format import (
    Header,
    PathPart,
    SnapshotFormatError,
    TensorLeaf,
    ValueLeaf,
    aligned,
    check_size,
    encode_header,
    parse_header,
    path_text,
)
from supervisor.errors import CheckpointError

MEMORY_DIR_ENV = "SUPERVISOR_MEMORY_DIR"
_STEP_DIR = re.compile(r"step_(\d+)")


class MemorySnapshotError(CheckpointError):
    """A memory snapshot that cannot be used (missing, torn, altered, or not this program's state)."""


def _leaves(obj: Any, path: tuple[PathPart, ...] = ()) -> list[tuple[tuple[PathPart, ...], Any]]:
    import torch

    if isinstance(obj, dict):
        out = []
        for key, value in obj.items():
            if isinstance(key, str):
                out += _leaves(value, (*path, ("k", key)))
            elif isinstance(key, int) and not isinstance(key, bool):
                out += _leaves(value, (*path, ("n", key)))
            else:
                raise MemorySnapshotError(f"a state dict key of type {type(key).__name__} at {path_text(path)}",
                                          "use string or integer keys")  # fmt: skip
        return out
    if isinstance(obj, (list, tuple)):
        return [leaf for i, value in enumerate(obj) for leaf in _leaves(value, (*path, ("i", i)))]
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, str)):
        return [(path, obj)]
    raise MemorySnapshotError(f"a {type(obj).__name__} at {path_text(path)} in the state dict",
                              "snapshot tensors and plain values only")  # fmt: skip


def _local(tensor: Any) -> tuple[Any, bool]:
    """(the plain tensor to save, whether it is a DTensor's local shard)."""
    to_local = getattr(tensor, "to_local", None)
    return (to_local(), True) if callable(to_local) and type(tensor).__name__ == "DTensor" else (tensor, False)


class MemorySnapshots:
    """Create it on every rank; ``enabled`` is False (and every call a no-op) when no memory directory is set."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, keep: int = 2) -> None:
        given = root if root is not None else os.environ.get(MEMORY_DIR_ENV)
        self.root = Path(given) if given else None
        self.keep = max(1, keep)
        self.rank, self.world = _rank_world()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mem-snapshot")
        self._pending: Future[Path] | None = None
        self._buffers: dict[tuple[PathPart, ...], Any] = {}

    @property
    def enabled(self) -> bool:
        return self.root is not None

    # -- saving ---------------------------------------------------------------------------------------------
    def save(self, state: dict[str, Any], step: int) -> Future[Path] | None:
        """Copy ``state`` (this rank's) into CPU buffers and write it in the background as step ``step``."""
        if self.root is None:
            return None
        self.wait()
        staged = self._stage(state)
        self._pending = self._pool.submit(self._write, staged, step)
        return self._pending

    def wait(self) -> Path | None:
        job, self._pending = self._pending, None
        if job is None:
            return None
        try:
            return job.result()
        except OSError as err:
            raise MemorySnapshotError(f"memory snapshot failed: {err}",
                                      "free /dev/shm; the filesystem checkpoints are not affected") from err

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)

    def _stage(self, state: dict[str, Any]) -> list[tuple[tuple[PathPart, ...], Any, bool]]:
        import torch

        staged = []
        for path, value in _leaves(state):
            if isinstance(value, torch.Tensor):
                local, is_dtensor = _local(value)
                src = local.detach()
                buf = self._buffers.get(path)
                if buf is None or buf.shape != src.shape or buf.dtype != src.dtype:
                    buf = self._buffers[path] = torch.empty(src.shape, dtype=src.dtype, device="cpu")
                buf.copy_(src)
                staged.append((path, buf, is_dtensor))
            else:
                staged.append((path, value, False))
        return staged

    def _write(self, staged: list[tuple[tuple[PathPart, ...], Any, bool]], step: int) -> Path:
        import torch

        assert self.root is not None
        leaves: list[TensorLeaf | ValueLeaf] = []
        offset = 0
        for path, value, is_dtensor in staged:
            if isinstance(value, torch.Tensor):
                nbytes = value.numel() * value.element_size()
                leaves.append(TensorLeaf(path, str(value.dtype).removeprefix("torch."), tuple(value.shape), offset,
                                         nbytes, is_dtensor))  # fmt: skip
                offset = aligned(offset + nbytes)
            else:
                leaves.append(ValueLeaf(path, value))
        head = encode_header(Header(step, self.rank, self.world, tuple(leaves), offset))
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder = self.root / f"step_{step}"
        folder.mkdir(mode=0o700, exist_ok=True)
        final = folder / f"rank_{self.rank}.snap"
        tmp = folder / f".rank_{self.rank}.snap.tmp"
        digest = hashlib.sha256()
        with open(tmp, "wb") as f:
            f.write(head)
            digest.update(head)
            written = 0
            for leaf, (_, value, _) in zip(leaves, staged, strict=True):
                if isinstance(leaf, TensorLeaf):
                    pad = leaf.offset - written
                    if pad:
                        f.write(b"\0" * pad)
                        digest.update(b"\0" * pad)
                    data = memoryview(value.contiguous().reshape(-1).view(torch.uint8).numpy())
                    f.write(data)
                    digest.update(data)
                    written = leaf.offset + leaf.nbytes
            tail = offset - written
            if tail:
                f.write(b"\0" * tail)
                digest.update(b"\0" * tail)
        size = tmp.stat().st_size
        os.replace(tmp, final)
        sidecar = {"step": step, "rank": self.rank, "world": self.world, "size": size, "sha256": digest.hexdigest()}
        side_tmp = folder / f".rank_{self.rank}.json.tmp"
        side_tmp.write_text(json.dumps(sidecar))
        os.replace(side_tmp, folder / f"rank_{self.rank}.json")
        self._retain(step)
        return final

    def _retain(self, newest: int) -> None:
        assert self.root is not None
        steps = sorted((int(m.group(1)), p) for p in self.root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)))
        for step, folder in steps[: max(0, len(steps) - self.keep)]:
            if step >= newest:
                continue
            for name in (f"rank_{self.rank}.json", f"rank_{self.rank}.snap"):  # the sidecar first: then it is gone
                (folder / name).unlink(missing_ok=True)
            try:
                folder.rmdir()  # the last rank of this node to let go removes it
            except OSError:
                pass

    # -- reading --------------------------------------------------------------------------------------------
    def load(self, step: int, state: dict[str, Any]) -> None:
        """Fill ``state`` (this rank's, as ``get_state_dict`` builds it) from the snapshot of ``step``."""
        if self.root is None:
            raise MemorySnapshotError("no memory directory", f"set {MEMORY_DIR_ENV} (the supervisor does)")
        folder = self.root / f"step_{step}"
        try:
            sidecar = json.loads((folder / f"rank_{self.rank}.json").read_text())
            with open(folder / f"rank_{self.rank}.snap", "rb") as f:  # into a writable buffer: tensors view it
                data = bytearray(os.fstat(f.fileno()).st_size)
                if f.readinto(data) != len(data):
                    raise OSError("the shard shrank while it was read")
        except (OSError, ValueError) as err:
            raise MemorySnapshotError(f"no snapshot of step {step} for rank {self.rank} here: {err}",
                                      "resume from the filesystem checkpoint") from None  # fmt: skip
        if not isinstance(sidecar, dict) or sidecar.get("size") != len(data) or \
                sidecar.get("sha256") != hashlib.sha256(data).hexdigest():  # fmt: skip
            raise MemorySnapshotError(f"the snapshot of step {step} for rank {self.rank} is torn or altered "
                                      "(size or SHA-256 differs from its record)", "resume from the filesystem checkpoint")
        try:
            header, start = parse_header(data)
            check_size(header, start, len(data))
        except SnapshotFormatError as err:
            raise MemorySnapshotError(f"the snapshot of step {step} is not readable: {err}",
                                      "resume from the filesystem checkpoint") from None  # fmt: skip
        if (header.step, header.rank, header.world) != (step, self.rank, self.world):
            raise MemorySnapshotError(f"the snapshot is of step {header.step}, rank {header.rank} of {header.world}; "
                                      f"wanted step {step}, rank {self.rank} of {self.world}",
                                      "resume from the filesystem checkpoint (it reshards)")  # fmt: skip
        _fill(state, header, memoryview(data)[start:])


def _fill(state: dict[str, Any], header: Header, payload: memoryview) -> None:
    import torch

    for leaf in header.leaves:
        parent: Any = state
        for _kind, key in leaf.path[:-1]:
            try:
                parent = parent[key]
            except (KeyError, IndexError, TypeError):
                raise MemorySnapshotError(f"the program's state has no {path_text(leaf.path)}",
                                          "restore into the state dict the snapshot was taken of") from None
        last = leaf.path[-1][1]
        if isinstance(leaf, ValueLeaf):
            if _get(parent, last) != leaf.value:
                _set_path(state, leaf.path, leaf.value)
            continue
        dtype = getattr(torch, leaf.dtype)
        raw = torch.frombuffer(payload, dtype=torch.uint8, count=leaf.nbytes, offset=leaf.offset) if leaf.nbytes \
            else torch.empty(0, dtype=torch.uint8)  # fmt: skip
        src = raw.view(dtype).reshape(leaf.shape)
        target = _get(parent, last)
        if target is None:
            if leaf.dtensor:
                raise MemorySnapshotError(f"the program's state has no DTensor at {path_text(leaf.path)}",
                                          "build the model and optimizer as when the snapshot was taken")
            _set_path(state, leaf.path, src.clone())
            continue
        local, _ = _local(target)
        if tuple(local.shape) != leaf.shape or local.dtype != dtype:
            raise MemorySnapshotError(f"{path_text(leaf.path)} is {tuple(local.shape)} {local.dtype} here, "
                                      f"{leaf.shape} {leaf.dtype} in the snapshot",
                                      "resume from the filesystem checkpoint (it reshards)")  # fmt: skip
        with torch.no_grad():
            local.copy_(src)


def _get(parent: Any, key: Any) -> Any:
    try:
        return parent[key]
    except (KeyError, IndexError, TypeError):
        return None


def _set_path(state: Any, path: tuple[PathPart, ...], value: Any) -> None:
    """``state[path] = value``; a tuple on the way (AdamW's ``betas``) is rebuilt and put back in its parent."""
    chain = [state]
    for _kind, key in path[:-1]:
        chain.append(chain[-1][key])
    for depth in range(len(path) - 1, -1, -1):
        container, key = chain[depth], path[depth][1]
        if isinstance(container, tuple):
            if not 0 <= key < len(container):
                break
            value = (*container[:key], value, *container[key + 1 :])
            continue
        try:
            container[key] = value
            return
        except (IndexError, TypeError):
            break
    raise MemorySnapshotError(f"cannot set {path_text(path)} in the program's state",
                              "restore into the state dict the snapshot was taken of")


def _rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def clear(root: str | os.PathLike[str]) -> None:
    """Remove every snapshot under ``root`` (the agent, when the campaign's memory is no longer wanted)."""
    shutil.rmtree(root, ignore_errors=True)

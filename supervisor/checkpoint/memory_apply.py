"""Putting a memory snapshot's shard back into the program's state: every leaf checked against the state first
(path, shape, dtype, DTensor or not), then the copies made, all or none (``MemorySnapshots.restore``). Also the
one error of the rank side of the memory tier."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from supervisor.checkpoint.snapshot_format import Header, PathPart, ValueLeaf, path_text
from supervisor.errors import CheckpointError


class MemorySnapshotError(CheckpointError):
    """A memory snapshot that cannot be used (missing, torn, altered, or not this program's state)."""


def local_tensor(tensor: Any) -> tuple[Any, bool]:
    """(the plain tensor to save, whether it is a DTensor's local shard)."""
    to_local = getattr(tensor, "to_local", None)
    return (to_local(), True) if callable(to_local) and type(tensor).__name__ == "DTensor" else (tensor, False)


def plan_restore(state: dict[str, Any], header: Header, payload: memoryview) -> list[Callable[[], None]]:
    """Check every leaf of the snapshot against ``state``; return the copies into it (made by the caller)."""
    import torch

    plan: list[Callable[[], None]] = []
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
                plan.append(partial(_set_path, state, leaf.path, leaf.value))
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
            plan.append(partial(_set_path, state, leaf.path, src.clone()))
            continue
        local, _ = local_tensor(target)
        if tuple(local.shape) != leaf.shape or local.dtype != dtype:
            raise MemorySnapshotError(f"{path_text(leaf.path)} is {tuple(local.shape)} {local.dtype} here, "
                                      f"{leaf.shape} {leaf.dtype} in the snapshot",
                                      "resume from the filesystem checkpoint (it reshards)")  # fmt: skip
        plan.append(partial(_copy, local, src))
    return plan


def _copy(target: Any, src: Any) -> None:
    import torch

    with torch.no_grad():
        target.copy_(src)


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

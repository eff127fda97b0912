"""The memory tier for programs that checkpoint with ``torch.distributed.checkpoint`` themselves: a DCP storage
writer and reader over the node's memory store, so FSDP2/DTensor, DDP or plain state dicts go in with the call
the program already makes::

    memory = DcpMemory()                      # does nothing unless the supervisor turned the tier on
    step = memory.resume_step()               # the snapshot the supervisor picked, checked on every rank
    if step is not None:
        dcp.load(state, storage_reader=memory.reader(step))
    ...
    if memory.due(step):                      # the cadence ("auto": measured), the same on every rank
        dcp.save(state, storage_writer=memory.writer(step))

Each rank's part is written as the same shard file ``CheckpointSaver.snapshot`` writes (``snapshot_format``:
``step_N/rank_R.snap`` and its record), so the node agent verifies, copies to the buddy and flushes it, and the
supervisor picks it, without knowing it came from DCP. The shard's state is ``{"dcp": {"items": JSON, "data":
[...]}}``: per DCP write item its key, chunk (offsets, sizes), the whole tensor's size and dtype, and its bytes as
a tensor (a non-tensor value, which DCP itself serializes, as a uint8 tensor of those bytes).

Why every rank writes all of its own items: DCP's default save planner gives a replicated tensor (DDP's
weights) to one rank only, but a memory snapshot is restored by each rank from its own node's copy (or its
buddy's), so each rank keeps its whole local state (the plan it made before DCP's deduplication). The reader
describes only this rank's chunks: that is what a restore on the same world and sharding needs, and the
supervisor only picks a memory snapshot for the same world (a resharding resume is the filesystem tier's).
"""

from __future__ import annotations

import io
import json
import os
import sys
from typing import Any

import torch
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from supervisor.checkpoint.memory import MemorySnapshots, agree_max, resume_step
from supervisor.checkpoint.memory_apply import MemorySnapshotError, local_tensor
from supervisor.checkpoint.snapshot_format import Header, TensorLeaf, ValueLeaf

_ITEMS = (("k", "dcp"), ("k", "items"))


class DcpMemory:
    """Create it on every rank, after ``init_process_group``; ``root``/``keep``/``every``/``group`` as for
    :class:`~supervisor.checkpoint.memory.MemorySnapshots` (default: what the supervisor set)."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, keep: int = 2, every: int | None = None,
                 group: Any = None) -> None:  # fmt: skip
        self.snapshots = MemorySnapshots(root, keep=keep, every=every, group=group)
        self.group = group
        self._checked: dict[int, tuple[Header, memoryview]] = {}

    @property
    def enabled(self) -> bool:
        return self.snapshots.enabled

    def due(self, step: int) -> bool:
        """Whether to snapshot ``step``; every rank calls it at every step and gets the same answer."""
        return self.snapshots.due(step)

    def writer(self, step: int) -> MemoryStorageWriter:
        return MemoryStorageWriter(self, step)

    def reader(self, step: int) -> MemoryStorageReader:
        return MemoryStorageReader(self, step)

    def resume_step(self) -> int | None:
        """The step of the snapshot the supervisor picked for this launch when every rank's shard of it is here
        and intact (the ranks agree: a collective when a step was picked), else None: resume from the
        filesystem checkpoint, as without the tier."""
        step = resume_step()
        if step is None or self.snapshots.root is None:
            return None
        try:
            self._checked[step] = self.snapshots.read_verified(step)
        except MemorySnapshotError as err:
            print(f"supervisor: memory snapshot not used: {err}; resuming from the filesystem checkpoint",
                  file=sys.stderr, flush=True)  # fmt: skip
        if agree_max(0 if step in self._checked else 1, self.group):
            self._checked.pop(step, None)
            return None
        return step

    def shard(self, step: int) -> tuple[Header, memoryview]:
        """This rank's checked shard of ``step`` (read once)."""
        if step not in self._checked:
            self._checked[step] = self.snapshots.read_verified(step)
        return self._checked[step]

    def close(self) -> None:
        """Wait for the last snapshot's write (call before the process exits)."""
        self.snapshots.close()


class MemoryStorageWriter(StorageWriter):
    """``dcp.save(state, storage_writer=memory.writer(step))``: this rank's items into node memory."""

    def __init__(self, memory: DcpMemory, step: int) -> None:
        super().__init__()
        self.memory, self.step = memory, step
        self.local_plan: SavePlan | None = None

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        pass

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.local_plan = plan  # every item of this rank's state, before replicated ones go to one rank
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        items = self.local_plan.items if self.local_plan is not None else plan.items
        rows: list[dict[str, Any]] = []
        data: list[Any] = []
        sizes: dict[MetadataIndex, int] = {}
        snapshots = self.memory.snapshots
        if snapshots.enabled:
            for item in items:
                value = planner.resolve_data(item)
                if item.type == WriteItemType.BYTE_IO:
                    raw = value.getvalue() if isinstance(value, io.BytesIO) else bytes(value)  # type: ignore[arg-type]
                    tensor = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
                    rows.append({"fqn": item.index.fqn, "offset": None, "kind": "bytes"})
                else:
                    tensor, _ = local_tensor(value)
                    meta = item.tensor_data
                    assert meta is not None
                    rows.append({"fqn": item.index.fqn, "offset": list(item.index.offset or ()), "kind": "tensor",
                                 "chunk_sizes": list(meta.chunk.sizes), "size": list(meta.size),
                                 "dtype": str(meta.properties.dtype).removeprefix("torch.")})  # fmt: skip
                data.append(tensor.detach())
                sizes[item.index] = tensor.numel() * tensor.element_size()
            # staged (copied) before this returns, written in the background; a failed write turns it off
            snapshots.save({"dcp": {"items": json.dumps(rows), "data": data}}, self.step)
        snapshots.taken(self.step)
        future: Future[list[WriteResult]] = Future()
        future.set_result([WriteResult(index=i.index, size_in_bytes=sizes.get(i.index, 0), storage_data=None)
                           for i in plan.items])  # fmt: skip
        return future

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        pass  # each rank's shard is committed by its own record; there is no global metadata file

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False


class MemoryStorageReader(StorageReader):
    """``dcp.load(state, storage_reader=memory.reader(step))``: this rank's items from its checked shard."""

    def __init__(self, memory: DcpMemory, step: int) -> None:
        super().__init__()
        self.memory, self.step = memory, step
        self.tensors: dict[int, torch.Tensor] = {}
        self.where: dict[MetadataIndex, int] = {}

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        pass

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        header, payload = self.memory.shard(self.step)
        rows: list[dict[str, Any]] | None = None
        for leaf in header.leaves:
            if isinstance(leaf, ValueLeaf) and leaf.path == _ITEMS and isinstance(leaf.value, str):
                rows = json.loads(leaf.value)
            elif isinstance(leaf, TensorLeaf) and leaf.path[:2] == (("k", "dcp"), ("k", "data")):
                raw = torch.frombuffer(payload, dtype=torch.uint8, count=leaf.nbytes, offset=leaf.offset) \
                    if leaf.nbytes else torch.empty(0, dtype=torch.uint8)  # fmt: skip
                self.tensors[int(leaf.path[2][1])] = raw.view(getattr(torch, leaf.dtype)).reshape(leaf.shape)
        if not isinstance(rows, list):
            raise MemorySnapshotError(f"the snapshot of step {self.step} was not written by DcpMemory",
                                      "restore it with CheckpointSaver.restore_snapshot")  # fmt: skip
        described: dict[str, TensorStorageMetadata | BytesStorageMetadata] = {}
        for j, row in enumerate(rows):
            index = MetadataIndex(row["fqn"], row["offset"])
            self.where[index] = j
            if row["kind"] == "bytes":
                described[row["fqn"]] = BytesStorageMetadata()
                continue
            md = described.setdefault(row["fqn"], TensorStorageMetadata(
                TensorProperties(dtype=getattr(torch, row["dtype"])), torch.Size(row["size"]), []))
            assert isinstance(md, TensorStorageMetadata)
            md.chunks.append(ChunkStorageMetadata(torch.Size(row["offset"]), torch.Size(row["chunk_sizes"])))
        return Metadata(state_dict_metadata=described, storage_data=dict(self.where))  # type: ignore[arg-type]

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        for req in plan.items:
            stored = self.tensors[self.where[req.storage_index]]
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(stored.numpy().tobytes()))
                continue
            source = narrow_tensor_by_index(stored, req.storage_offsets, req.lengths)
            target = planner.resolve_tensor(req).detach()
            if target.size() != source.size():
                raise MemorySnapshotError(f"{req.storage_index.fqn} is {tuple(target.size())} here, "
                                          f"{tuple(source.size())} in the snapshot",
                                          "resume from the filesystem checkpoint (it reshards)")  # fmt: skip
            target.copy_(source)
            planner.commit_tensor(req, target)
        future: Future[None] = Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return False

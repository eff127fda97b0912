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

At a relaunch the supervisor names the step to resume from (``SUPERVISOR_RESUME_MEMORY_STEP``, picked from what
the node agents verified); :meth:`MemorySnapshots.restore` reads and checks every rank's shard first, the ranks
agree, and only then is anything copied into the program's state: one rank's refused shard sends every rank to
the filesystem tier with its state untouched. Each record names the launch that wrote it (``SUPERVISOR_LAUNCH``),
so a step written again by a relaunch is never mixed with the dead launch's shards.

A write that fails (``/dev/shm`` full) turns the snapshots off for this process with one line on stderr; the
training and the filesystem checkpoints go on.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import sys
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from supervisor import client
from supervisor.checkpoint import memory_room
from supervisor.checkpoint.memory_apply import MemorySnapshotError, local_tensor, plan_restore
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
from supervisor.decisions.snapshot_cadence import every_k_steps, parse_every
from supervisor.decisions.snapshot_ring import RING, retained
from supervisor.paths import expand_slot_dir

MEMORY_DIR_ENV = "SUPERVISOR_MEMORY_DIR"  # the node's store; ``{node}`` is filled in as for the slot directory
RESUME_STEP_ENV = "SUPERVISOR_RESUME_MEMORY_STEP"  # the step the supervisor picked for this launch (unset: none)
RESUME_LAUNCH_ENV = "SUPERVISOR_RESUME_MEMORY_LAUNCH"  # and the launch that wrote that snapshot
RESUME_FLUSHED_ENV = "SUPERVISOR_RESUME_MEMORY_FLUSHED"  # and its copy on the filesystem, when some rank reads it
EVERY_ENV = "SUPERVISOR_MEMORY_EVERY"  # "auto" (measured) or every N steps
LAUNCH_ENV = "SUPERVISOR_LAUNCH"  # which launch wrote a shard
_STEP_DIR = re.compile(r"step_(\d+)")


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


class MemorySnapshots:
    """Create it on every rank; ``enabled`` is False (and every call a no-op) when no memory directory is set."""

    def __init__(self, root: str | os.PathLike[str] | None = None, *, keep: int = 2, every: int | None = None,
                 group: Any = None, ring: tuple[int, ...] = RING) -> None:  # fmt: skip
        """``every``: snapshot every N steps (None: ``SUPERVISOR_MEMORY_EVERY``, "auto" by default: measured);
        ``group``: the process group the ranks agree on (None: the default one); ``keep`` newest snapshots and,
        for each distance in ``ring``, two older ones to roll back to (``decisions.snapshot_ring``)."""
        self.root = Path(root) if root is not None else _root_from_env()
        self.keep, self.ring = max(1, keep), ring
        self.rank, self.world = _rank_world()
        self.launch = os.environ.get(LAUNCH_ENV, "")
        self.group = group
        try:
            self.every = every if every is not None else parse_every(os.environ.get(EVERY_ENV, "auto"))
        except ValueError as err:
            self.every = None
            _say(f"{err}; measuring it instead")
        self.off_reason = ""
        self._room_checked = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mem-snapshot")
        self._pending: Future[Path] | None = None
        self._buffers: dict[tuple[PathPart, ...], Any] = {}
        self._first: tuple[int, float, float] | None = None  # (step, end time, blocking cost) of the first snapshot
        self._due_at = 0.0  # when the newest snapshot was found due (the step time is measured up to there)
        self._measured: int | None = None  # this rank's measured interval, until the ranks agree on one
        self.blocking_s = 0.0  # the last snapshot's blocking copy
        if self.root is not None:
            try:  # the node agent made it already under the supervisor; a standalone run makes its own
                self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as err:
                self._turn_off(err.errno or 0, f"cannot make {self.root} ({err})")

    @property
    def enabled(self) -> bool:
        return self.root is not None and not self.off_reason

    # -- cadence ----------------------------------------------------------------------------------------
    def snapshot(self, state: dict[str, Any] | Callable[[], dict[str, Any]], step: int) -> bool:
        """Snapshot ``state`` (or what the callable returns, built only when one is due) as step ``step`` if
        the cadence says so; every rank calls it at every step. Returns whether one was taken."""
        if not self.due(step):
            return False
        took = self.enabled  # a rank whose store failed it still joins the cadence's agreement, taking nothing
        if took:
            self._take(state, step)
        self.taken(step)
        return took

    def due(self, step: int) -> bool:
        """Whether the cadence wants a snapshot of ``step``: the same answer on every rank (a DCP save is a
        collective, ``dcp_memory``), so a rank whose store failed it still answers as the others do and only
        skips its writes. While "auto" is measuring, the first two are due; the rank after the second, the ranks
        agree on the measured interval here (every rank calls ``due`` at every step)."""
        if self.root is None:
            return False
        if self.every is None and self._measured is not None:
            self.every = agree_max(self._measured, self.group)
        if self.every is None:
            self._due_at = time.monotonic()
            return True
        return step % self.every == 0

    def taken(self, step: int) -> None:
        """After the snapshot ``due`` asked for (taken or skipped): while measuring, the cadence learns from it."""
        if self.every is not None or self._measured is not None:
            return
        if self._first is None or step <= self._first[0]:
            self._first = (step, time.monotonic(), self.blocking_s)
            return
        first_step, first_end, first_cost = self._first
        step_s = (self._due_at - first_end) / (step - first_step)
        # The second snapshot's copy reused the first one's buffers, as every later one will, and of two
        # measurements the smaller is the cost (a busy machine only ever adds to one).
        self._measured = every_k_steps(min(first_cost, self.blocking_s), step_s)

    def _take(self, state: dict[str, Any] | Callable[[], dict[str, Any]], step: int) -> None:
        self.save(state() if callable(state) else state, step)

    # -- saving ---------------------------------------------------------------------------------------------
    def save(self, state: dict[str, Any], step: int) -> Future[Path] | None:
        """Copy ``state`` (this rank's) into CPU buffers and write it in the background as step ``step``."""
        if not self.enabled:
            return None
        self.wait()
        if not self.enabled:  # the previous write failed
            return None
        if not self._store_there():
            return None
        started = time.perf_counter()
        staged = self._stage(state)
        self.blocking_s = time.perf_counter() - started
        if not self._room_checked:
            self._room_checked = True
            if not self._room_for(staged):
                return None
        self._pending = self._pool.submit(self._write, staged, step)
        return self._pending

    def wait(self) -> Path | None:
        """The pending write's shard; a failed write (the store full) turns snapshots off, with one line."""
        job, self._pending = self._pending, None
        if job is None:
            return None
        try:
            return job.result()
        except OSError as err:
            if isinstance(err, FileNotFoundError) and not self._store_there():
                return None  # the agent removed the store under the write: the job is ending, not a failure
            self._turn_off(err.errno or 0, f"writing to {self.root} failed ({err})")
            return None

    def _store_there(self) -> bool:
        """The store is made once, at start; when it is gone later, its node agent removed it (the job or the
        agents' step is ending). Then this rank writes nothing: a store it made again would outlive the job in
        the node's memory, with nobody left to remove it. A restarted agent makes it anew; snapshots go on then."""
        assert self.root is not None
        return self.root.is_dir()

    def _turn_off(self, errno_code: int, why: str) -> None:
        """Snapshots off in this process, said once here and, through a marker the agent reports, in the journal
        (the supervisor turns them off for the campaign: ``checkpoint.memory_room``)."""
        self.off_reason = f"memory snapshots off for this run: {why}"
        _say(f"{self.off_reason}; the filesystem checkpoints go on (free /dev/shm, or set "
             "[run] memory_snapshots = \"off\")")  # fmt: skip
        if self.root is not None:
            memory_room.mark_off(self.root, self.rank, errno_code)

    def _room_for(self, staged: list[tuple[tuple[PathPart, ...], Any, bool]]) -> bool:
        """Before the first write: does the node's store have room for what the tier will keep there?"""
        shard = sum(v.numel() * v.element_size() for _, v, _ in staged if hasattr(v, "element_size"))
        assert self.root is not None
        why = memory_room.short_of_room(self.root, shard, self.keep, int(os.environ.get("LOCAL_WORLD_SIZE") or 1),
                                        len(self.ring))  # fmt: skip
        if why:
            self._turn_off(errno.ENOSPC, why)
        return not why

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
                local, is_dtensor = local_tensor(value)
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
        folder = self.root / f"step_{step}"
        folder.mkdir(mode=0o700, exist_ok=True)
        final = folder / f"rank_{self.rank}.snap"
        tmp = folder / f".rank_{self.rank}.snap.tmp"
        digest = hashlib.sha256()
        try:
            self._write_file(tmp, head, leaves, staged, offset, digest)
        except OSError:
            tmp.unlink(missing_ok=True)  # a full store keeps no half shard
            raise
        size = tmp.stat().st_size
        os.replace(tmp, final)
        sidecar = {"step": step, "rank": self.rank, "world": self.world, "size": size, "sha256": digest.hexdigest(),
                   "launch": self.launch}  # fmt: skip
        side_tmp = folder / f".rank_{self.rank}.json.tmp"
        side_tmp.write_text(json.dumps(sidecar))
        os.replace(side_tmp, folder / f"rank_{self.rank}.json")
        self._retain(step)
        return final

    @staticmethod
    def _write_file(tmp: Path, head: bytes, leaves: list[TensorLeaf | ValueLeaf],
                    staged: list[tuple[tuple[PathPart, ...], Any, bool]], offset: int, digest: Any) -> None:  # fmt: skip
        import torch

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

    def _retain(self, newest: int) -> None:
        assert self.root is not None
        steps = sorted((int(m.group(1)), p) for p in self.root.iterdir() if (m := _STEP_DIR.fullmatch(p.name)))
        keep = retained((step for step, _ in steps), newest, self.keep, self.ring)  # the newest few and the roll-back ring
        for step, folder in steps:
            if step in keep:
                continue
            for name in (f"rank_{self.rank}.json", f"rank_{self.rank}.snap"):  # the sidecar first: then it is gone
                (folder / name).unlink(missing_ok=True)
            try:
                folder.rmdir()  # the last rank of this node to let go removes it
            except OSError:
                pass

    # -- reading --------------------------------------------------------------------------------------------
    def restore(self, state: dict[str, Any]) -> int | None:
        """Every rank calls it at start: fill ``state`` from the snapshot the supervisor picked for this launch and
        return its step; None when there is none, or when any rank's shard is refused (then no rank's ``state``
        was touched: resume from the filesystem tier). Marked as a ``restore`` phase: the supervisor's recovery
        timings tell the state load from the rest of a restart with it (nested in the program's own: counted once)."""
        step = resume_step()
        if step is None or self.root is None:
            return None
        with client.phase("restore"):
            return self._restore(step, state)

    def _restore(self, step: int, state: dict[str, Any]) -> int | None:
        try:
            plan: list[Callable[[], None]] | None = self._prepare(step, state)
        except MemorySnapshotError as err:
            _say(f"memory snapshot not used: {err}; resuming from the filesystem checkpoint")
            plan = None
        if agree_max(0 if plan is not None else 1, self.group):
            return None  # some rank cannot: all resume from the filesystem tier
        assert plan is not None
        for apply in plan:
            apply()
        return step

    def load(self, step: int, state: dict[str, Any]) -> None:
        """Fill ``state`` (this rank's, as ``get_state_dict`` builds it) from the snapshot of ``step``; refused
        (``MemorySnapshotError``) before anything is copied when the shard is missing, damaged or not this state's."""
        for apply in self._prepare(step, state):
            apply()

    def _folder_of(self, step: int) -> Path:
        """Where this rank's shard of ``step`` is: this node's own store, else the copy the node keeps as another
        node's buddy (``replica/<node>/``: the rank moved here from that node), else the snapshot flushed to the
        filesystem before the previous job stopped (``SUPERVISOR_RESUME_MEMORY_FLUSHED``); the one written by
        the launch the supervisor picked (``SUPERVISOR_RESUME_MEMORY_LAUNCH``) when it says."""
        assert self.root is not None
        wanted = os.environ.get(RESUME_LAUNCH_ENV, "")
        own = self.root / f"step_{step}"
        try:
            copies = sorted(p / f"step_{step}" for p in (self.root / "replica").iterdir())
        except OSError:
            copies = []
        flushed = os.environ.get(RESUME_FLUSHED_ENV, "")
        if flushed:
            copies.append(Path(flushed))
        for folder in [own, *copies]:
            try:
                record = json.loads((folder / f"rank_{self.rank}.json").read_text())
            except (OSError, ValueError):
                continue
            if not wanted or isinstance(record, dict) and record.get("launch") == wanted:
                return folder
        return own

    def _prepare(self, step: int, state: dict[str, Any]) -> list[Callable[[], None]]:
        """Read and check this rank's shard of ``step`` against ``state``; the copies to make, not yet made."""
        header, payload = self.read_verified(step)
        return plan_restore(state, header, payload)

    def read_verified(self, step: int) -> tuple[Header, memoryview]:
        """This rank's shard of ``step``: its header and payload, read into memory and checked against its
        record (size, SHA-256) and this rank and world; ``MemorySnapshotError`` when it is not usable."""
        if self.root is None:
            raise MemorySnapshotError("no memory directory", f"set {MEMORY_DIR_ENV} (the supervisor does)")
        folder = self._folder_of(step)
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
        return header, memoryview(data)[start:]


def _rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def resume_step() -> int | None:
    """The memory snapshot step the supervisor picked for this launch, or None."""
    value = os.environ.get(RESUME_STEP_ENV, "").strip()
    return int(value) if value.isdigit() else None


def _root_from_env() -> Path | None:
    template = os.environ.get(MEMORY_DIR_ENV, "")
    if not template:
        return None
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    return expand_slot_dir(template, job=os.environ.get("SLURM_JOB_ID", ""), node=node)


def agree_max(value: int, group: Any = None) -> int:
    """The largest ``value`` over the ranks (the value itself without torch.distributed). On an NCCL group the
    number travels on the current GPU."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        return value
    if not (dist.is_available() and dist.is_initialized()):
        return value
    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"
    t = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def _say(text: str) -> None:
    print(f"supervisor: {text}", file=sys.stderr, flush=True)


def clear(root: str | os.PathLike[str]) -> None:
    """Remove every snapshot under ``root`` (the agent, when the campaign's memory is no longer wanted)."""
    shutil.rmtree(root, ignore_errors=True)

"""Training side: save a sharded torch.distributed.checkpoint (DCP) so that it is valid only once durable.

Protocol (every rank calls ``save``): rank 0 creates ``ROOT/.incomplete-step_N-<nonce>`` and broadcasts
its name; all ranks write their DCP shards into it (DCP fsyncs every file); each rank hashes its own
shards and rank 0 gathers the results; rank 0 fsyncs the directory, writes and fsyncs ``manifest.json``,
renames the directory to ``ROOT/step_N`` and fsyncs ROOT, and only then moves ``LATEST`` and applies
retention. Rank 0 broadcasts the outcome, which doubles as the barrier the other ranks wait on.

Async save blocks the training loop only while the state is copied (staged) to CPU memory; the write,
hash and commit run in one background thread on a dedicated gloo process group, and a second save
first waits for the previous one. torch is imported lazily so ``supervisor.checkpoint`` stays torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import signal
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from supervisor.checkpoint import trust
from supervisor.checkpoint.durable import fsync_path, rename_durable, write_durable
from supervisor.checkpoint.fingerprint import fingerprint, torch_versions
from supervisor.checkpoint.hashing import DEFAULT_ALGORITHM, hash_file
from supervisor.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, parse_manifest
from supervisor.checkpoint.store import CheckpointStore, checkpoint_name
from supervisor.checkpoint.validate import DCP_METADATA, INCOMPLETE_PREFIX, validate_checkpoint
from supervisor.errors import CheckpointError

# Single-process saves/loads are intended here; DCP warns about them on every call.
warnings.filterwarnings("ignore", message="torch.distributed is disabled")

# Fault injection for the crash tests: SIGKILL this process at a named point of the protocol.
KILL_AT_ENV = "SUPERVISOR_CKPT_KILL_AT"
KILL_POINTS = ("after_mkdir", "after_shards", "after_hash", "after_manifest", "after_rename")


def _fault_point(name: str) -> None:
    if os.environ.get(KILL_AT_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class CheckpointSaver:
    """Saves checkpoints of ``step`` under ``root``; create it on every rank (it may create a process group)."""

    def __init__(self, root: str | os.PathLike[str], *, keep_last: int = 3, keep_every: int = 0,
                 hash_algorithm: str = DEFAULT_ALGORITHM, seeds: dict[str, Any] | None = None,
                 thread_count: int = 1) -> None:
        import torch.distributed as dist

        self.root = Path(root)
        self.keep_last, self.keep_every = keep_last, keep_every
        self.hash_algorithm, self.seeds, self.thread_count = hash_algorithm, dict(seeds or {}), thread_count
        self.key = trust.key_from_env()  # the campaign's manifest key when supervised (SUPERVISOR_CAMPAIGN)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.distributed else 0
        self.world = dist.get_world_size() if self.distributed else 1
        # A group of its own, so background checkpoint collectives never interleave with training ones.
        self.group = dist.new_group(backend="gloo") if self.distributed else None
        if self.group is not None:
            from supervisor.client.collectives import ignore_group

            ignore_group(self.group)  # its (background) collectives are nobody's wait for peers (own time)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-save")
        self._pending: Future[Path] | None = None
        self._staging: dict[tuple[Any, ...], Any] = {}  # reused CPU buffers for async saves
        from supervisor.checkpoint.memory import MemorySnapshots

        # The memory tier (on when supervised and not ``[run] memory_snapshots = "off"``): see ``snapshot``.
        self.memory = MemorySnapshots()
        if self.rank == 0:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
            from supervisor.client.declare import saves_to

            saves_to(self.root)  # the supervisor scans it even when the command's flags do not name it

    # -- public API ------------------------------------------------------------------------------------
    def save(self, state_dict: dict[str, Any], step: int, *, extra: dict[str, Any] | None = None,
             async_save: bool = False) -> Future[Path]:
        """Save ``state_dict`` (tensors and nested dicts of tensors) as the checkpoint of ``step``.

        Returns a Future of the committed path; with ``async_save=False`` it is already done (and a
        failure raises CheckpointError here). All ranks must call ``save`` with the same step.
        """
        self.wait()
        staged = _stage(state_dict, self._staging) if async_save else state_dict
        job = self._pool.submit(self._save_and_commit, staged, step, dict(extra or {}))
        self._pending = job
        if not async_save:
            self.wait()
        return job

    def snapshot(self, state: dict[str, Any] | Callable[[], dict[str, Any]], step: int) -> bool:
        """The memory tier: every rank calls this at the end of every step; at the cadence chosen (measured, or
        ``[run] memory_snapshots``) this rank's state (or what the callable returns, built only then) is copied
        into node memory, from which a relaunch resumes losing a step or two instead of a checkpoint interval.
        A no-op (False) when unsupervised or off."""
        return self.memory.snapshot(state, step)

    def restore_snapshot(self, state: dict[str, Any]) -> int | None:
        """Every rank calls this at start, before looking for a filesystem checkpoint: ``state`` filled from the
        memory snapshot the supervisor picked for this launch, and its step; None (``state`` untouched) when there
        is none or any rank's copy is refused: resume from the filesystem tier then."""
        return self.memory.restore(state)

    def wait(self) -> Path | None:
        """Block until the pending save (if any) is committed; re-raise its failure as CheckpointError."""
        job, self._pending = self._pending, None
        if job is None:
            return None
        try:
            return job.result()
        except (CheckpointError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # DCP's CheckpointException derives from BaseException
            raise CheckpointError(f"checkpoint save failed: {_describe(err)}",
                                  "free disk space or fix the checkpoint directory; the previous checkpoint "
                                  "is still valid") from err

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._pool.shutdown(wait=True)
            self.memory.close()

    # -- protocol --------------------------------------------------------------------------------------
    def _save_and_commit(self, state: dict[str, Any], step: int, extra: dict[str, Any]) -> Path:
        import torch
        import torch.distributed.checkpoint as dcp

        tmp_name = ""
        if self.rank == 0:
            tmp_name, err = f"{INCOMPLETE_PREFIX}{checkpoint_name(step)}-{secrets.token_hex(4)}", ""
            try:
                (self.root / tmp_name).mkdir(mode=0o700)
            except OSError as e:
                tmp_name, err = "", f"ERROR cannot create {self.root / tmp_name}: {e}"
            tmp_name = self._broadcast(tmp_name or err)
        else:
            tmp_name = self._broadcast("")
        if tmp_name.startswith("ERROR "):
            raise CheckpointError(tmp_name[6:], "check that the checkpoint directory is writable")
        tmp = self.root / tmp_name
        _fault_point("after_mkdir")
        writer = dcp.FileSystemWriter(str(tmp), sync_files=True, thread_count=self.thread_count)
        try:
            metadata = dcp.save(state, storage_writer=writer, process_group=self.group,
                                no_dist=not self.distributed)
        except BaseException as err:  # DCP's CheckpointException derives from BaseException
            # torch's writer often hides ENOSPC behind "unexpected pos": judge by the free space left.
            free, need = _free_bytes(tmp), _nbytes(state)
            # DCP reports a write failure on every rank, so no rank still writes here: free the space.
            if self.rank == 0:
                shutil.rmtree(tmp, ignore_errors=True)
            if free is not None and (free < need or "No space left" in str(err)):
                raise CheckpointError(
                    f"checkpoint save of step {step} failed: disk full ({free / 2**20:.1f} MiB free on "
                    f"{self.root}, the state needs {need / 2**20:.1f} MiB)",
                    "free disk space or lower retention (keep_last); the previous checkpoint is still valid",
                ) from err
            raise
        _fault_point("after_shards")
        files = sorted({info.relative_path for info in metadata.storage_data.values()} | {DCP_METADATA})
        mine = [f for f in files if _owner(f, self.world) == self.rank]
        report = _hash_own(tmp, mine, self.hash_algorithm)
        reports = self._gather(report)
        _fault_point("after_hash")
        outcome = ""
        if self.rank == 0:
            try:
                final = self._commit(tmp, step, extra, reports, torch.__version__, torch_versions(torch))
                outcome = f"OK {final.name}"
            except Exception as err:  # tell the other ranks instead of leaving them in the barrier
                outcome = f"ERROR {_describe(err)}"
        outcome = self._broadcast(outcome)
        if not outcome.startswith("OK "):
            raise CheckpointError(f"checkpoint commit of step {step} failed: {outcome[6:]}",
                                  "free disk space or fix the checkpoint directory; the previous one is still valid")
        final = self.root / outcome[3:]
        if self.rank == 0:
            CheckpointStore(self.root, key=self.key).apply_retention(self.keep_last, self.keep_every)
        return final

    def _commit(self, tmp: Path, step: int, extra: dict[str, Any], reports: list[dict[str, Any]],
                torch_version: str, versions: dict[str, str | None] | None = None) -> Path:
        entries: list[FileEntry] = []
        for report in reports:
            if report.get("error"):
                raise OSError(report["error"])
            entries += [FileEntry(p, s, h) for p, s, h in report["files"]]
        fsync_path(tmp)  # the shard directory entries, created by every rank
        manifest = Manifest(step=step, time=time.time(), world_size=self.world, hash_algorithm=self.hash_algorithm,
                            files=tuple(sorted(entries, key=lambda e: e.path)),
                            env=fingerprint(torch_version, self.seeds, versions), extra=extra)
        if self.key is not None:  # supervised: authenticate it, and the files torch unpickles, with the campaign key
            sha = {e.path: trust.sha256_file(tmp / e.path) for e in manifest.files if trust.is_pickled(e.path)}
            manifest = dataclasses.replace(manifest, auth=trust.make_auth(self.key, manifest.to_doc(), sha))
        write_durable(tmp / MANIFEST_NAME, manifest.to_json())
        _fault_point("after_manifest")
        final = self.root / checkpoint_name(step)
        store = CheckpointStore(self.root, key=self.key)
        if final.exists():  # a re-save of the same step (resumed from an older one): keep the old aside
            store.quarantine(final, f"replaced by a new save of step {step}")
        rename_durable(tmp, final)
        _fault_point("after_rename")
        store.set_latest(final.name)
        return final

    # -- small collectives on strings (JSON), never pickles -----------------------------------------------
    def _broadcast(self, text: str) -> str:
        if not self.distributed:
            return text
        return self._all_gather_bytes(text.encode())[0].decode()

    def _gather(self, report: dict[str, Any]) -> list[dict[str, Any]]:
        data = json.dumps(report).encode()
        if not self.distributed:
            return [report]
        return [json.loads(b) for b in self._all_gather_bytes(data)]

    def _all_gather_bytes(self, data: bytes) -> list[bytes]:
        import torch
        import torch.distributed as dist

        length = torch.tensor([len(data)], dtype=torch.int64)
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(lengths, length, group=self.group)
        longest = max(int(n.item()) for n in lengths) or 1
        buf = torch.zeros(longest, dtype=torch.uint8)
        if data:
            buf[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        bufs = [torch.zeros(longest, dtype=torch.uint8) for _ in range(self.world)]
        dist.all_gather(bufs, buf, group=self.group)
        return [bytes(b[: int(n.item())].tolist()) for b, n in zip(bufs, lengths, strict=True)]


def _owner(relative_path: str, world: int) -> int:
    """The rank that hashes a file: its writer (DCP names shards ``__RANK_N.distcp``), else rank 0."""
    match = re.match(r"__(\d+)_", relative_path)
    rank = int(match.group(1)) if match else 0
    return rank if rank < world else 0


def _hash_own(tmp: Path, files: list[str], algorithm: str) -> dict[str, Any]:
    try:
        out = []
        for rel in files:
            size, digest = hash_file(tmp / rel, algorithm)
            out.append((rel, size, digest))
        return {"files": out}
    except OSError as err:
        return {"error": f"hashing {tmp}: {err}", "files": []}


def _stage(obj: Any, cache: dict[tuple[Any, ...], Any], key: tuple[Any, ...] = ()) -> Any:
    """Copy every tensor to CPU memory so training can keep mutating the originals (async save).

    Buffers are reused from ``cache`` across saves (same key, shape and dtype): touching fresh memory
    costs page faults that made staging 3-5x slower. Reuse is safe because a save first waits for the
    previous one to finish with them.
    """
    import torch

    if isinstance(obj, torch.Tensor):
        buf = cache.get(key)
        if buf is None or buf.shape != obj.shape or buf.dtype != obj.dtype:
            buf = cache[key] = torch.empty(obj.shape, dtype=obj.dtype, device="cpu")
        buf.copy_(obj.detach())
        return buf
    if isinstance(obj, dict):
        return {k: _stage(v, cache, (*key, k)) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(_stage(v, cache, (*key, i)) for i, v in enumerate(obj))
    return obj


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def _nbytes(obj: Any) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_nbytes(v) for v in obj)
    return 0


def _describe(err: BaseException) -> str:
    text = [line for line in str(err).strip().splitlines() if line.strip()]
    # DCP's CheckpointException text is per-rank tracebacks: the last line is the real error.
    first = (text[-1].strip() if "Traceback" in str(err) else text[0]) if text else err.__class__.__name__
    if "No space left" in str(err):
        return f"disk full (No space left on device): {first}"
    return first


# -- resume side ---------------------------------------------------------------------------------------
RESUME_ENV = "SUPERVISOR_RESUME_FROM"


def resume_path(root: str | os.PathLike[str]) -> Path | None:
    """Where this run resumes from: ``SUPERVISOR_RESUME_FROM`` when set (empty = fresh start), else the
    newest valid checkpoint under ``root`` (rank 0 decides and quarantines, then tells the other ranks).
    """
    if RESUME_ENV in os.environ:
        value = os.environ[RESUME_ENV].strip()
        return Path(value) if value else None
    import torch
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    choice = ""
    if not distributed or dist.get_rank() == 0:
        if Path(root).is_dir():
            info = CheckpointStore(root, key=trust.key_from_env()).newest_valid(full=False, quarantine=True)
            choice = str(info.path) if info else ""
    if distributed:
        data = choice.encode()
        length = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(length, 0)
        buf = torch.zeros(int(length.item()), dtype=torch.uint8)
        if dist.get_rank() == 0 and data:
            buf.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        if length.item():
            dist.broadcast(buf, 0)
        choice = bytes(buf.tolist()).decode()
    return Path(choice) if choice else None


def load(path: str | os.PathLike[str], state_dict: dict[str, Any]) -> Manifest | None:
    """Load a checkpoint into ``state_dict`` in place (DCP); return its manifest (None for an adopted DCP dir).

    A quick validation runs first, so a torn checkpoint fails with a clear CheckpointError naming the
    defect instead of a torch error, and torch never reads the (pickled) .metadata of a torn directory.
    """
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    v = validate_checkpoint(Path(path), full=False, key=trust.key_from_env())
    if not v.usable:
        raise CheckpointError(f"cannot resume from {path}: {v.status}: {v.reason}",
                              "unset SUPERVISOR_RESUME_FROM or point it at a valid checkpoint")
    distributed = dist.is_available() and dist.is_initialized()
    dcp.load(state_dict, checkpoint_id=str(path), no_dist=not distributed)
    return v.manifest


def read_manifest(path: str | os.PathLike[str]) -> Manifest:
    """The manifest of the checkpoint at ``path``, or a CheckpointError saying why it cannot be resumed."""
    path = Path(path)
    try:
        return parse_manifest((path / MANIFEST_NAME).read_bytes())
    except (OSError, ValueError) as err:
        raise CheckpointError(f"cannot resume from {path}: {err}",
                              "unset SUPERVISOR_RESUME_FROM or point it at a valid checkpoint") from err

"""Own time per step: how long each step waited for peers in collectives, so the supervisor can tell the slow
rank from the ranks that wait for it.

WHY: in synchronous data parallelism every rank's step period is the slowest rank's (the others block in the
gradient all-reduce until it arrives), so step periods cannot name a straggler. Each rank stamps its waits into
its slot (one aligned store, outside ``client.step()``); the reader subtracts them from the step times.

* ``watch_ddp(ddp_model)``: once, after wrapping the model. Registers a DDP communication hook that wraps the
  all-reduce (DDP's default one, or the hook you pass) and measures, for the last gradient bucket of each
  backward pass, the time from handing it to the collective to the collective's completion: after the last
  bucket is ready the rank has nothing left to compute, so that interval is waiting for the slowest peer (plus
  the transfer, the same on every rank). torch is imported here only, when called.
* ``watch_collectives()``: once, after ``init_process_group``: for FSDP2 and any program calling
  ``torch.distributed``'s collectives. Every blocking collective called as ``dist.<name>(...)`` and every
  ``Work.wait()`` of an asynchronous one counts as waiting (a collective called from inside another is counted
  once). On NCCL the host does not wait (the GPU does): the time the calling stream spends from the call to the
  collective's end is measured with CUDA events instead and read once the GPU has passed them.
* ``with waiting(): dist.all_reduce(...)``: for other collectives (a non-DDP loop, a metrics all-reduce placed
  where peers wait): the block's duration counts as waiting.

Both are no-ops when no supervisor runs the program. See docs/client.md, "Own time".
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from supervisor.client import api as _api


def _timed(inner: Callable[[Any, Any], Any], mono: Callable[[], int] = time.monotonic_ns) -> Callable[[Any, Any], Any]:
    """``inner`` (a DDP comm hook) with the last bucket's wait stamped into the slot when its future completes."""
    arrived = [0]

    def stamp(fut: Any) -> Any:
        try:
            _api._add_wait(mono() - arrived[0])
        except Exception:  # noqa: S110 - the measure must never fail the all-reduce
            pass
        return fut.value()  # re-raises the collective's own error: DDP reports it as it would have

    def timed_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP refuses annotations other than its own
        if not bucket.is_last():
            return inner(state, bucket)
        arrived[0] = mono()
        return inner(state, bucket).then(stamp)

    timed_hook.__qualname__ = f"supervisor_timed({getattr(inner, '__qualname__', 'hook')})"
    return timed_hook


def _allreduce_as_builtin(process_group: Any, bucket: Any) -> Any:
    """DDP's default gradient averaging as its built-in C++ hook computes it: scale by 1/size, then sum. Bitwise
    the same gradients (torch's Python ``allreduce_hook`` divides instead, which differs in the last bit for a
    world size that is not a power of two), so a supervised run matches an unsupervised one exactly."""
    import torch.distributed as dist

    group: Any = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.mul_(1.0 / group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(lambda fut: fut.value()[0])


def watch_ddp(model: Any, hook: Callable[[Any, Any], Any] | None = None, state: Any = None) -> bool:
    """Measure this rank's collective waits in a ``DistributedDataParallel`` model's backward pass. Call once,
    before training. ``hook``/``state``: your own comm hook and its state, if you use one (it is wrapped; DDP
    takes only one hook). Returns True when the hook is registered; False when unsupervised (nothing is changed)
    or when DDP refused it (a warning says why; training goes on without own times)."""
    if not _api.is_supervised():
        return False
    from torch.nn.parallel import DistributedDataParallel  # torch only here, when asked for

    if not isinstance(model, DistributedDataParallel):  # FSDP's comm hooks take (state, grad): not ours to wrap
        _api._warn_once("watch_ddp", f"watch_ddp needs a DistributedDataParallel model, got {type(model).__name__}",
                        "pass the DDP-wrapped model, or time your collectives with client.waiting()")  # fmt: skip
        return False
    if hook is None:
        hook, state = _allreduce_as_builtin, getattr(model, "process_group", None)
    try:
        model.register_comm_hook(state, _timed(hook))
    except (RuntimeError, TypeError, ValueError) as exc:
        _api._warn_once("watch_ddp", f"cannot register the timing comm hook: {exc}".splitlines()[0],
                        "register your own hook through client.watch_ddp(model, hook=..., state=...)")  # fmt: skip
        return False
    _api._enable_waits()
    return True


class waiting:  # noqa: N801 - used like a function: `with client.waiting():`
    """Count the block's duration as waiting for peers (wrap a blocking collective). A no-op when unsupervised."""

    __slots__ = ("t0",)

    def __enter__(self) -> waiting:
        _api._enable_waits()
        self.t0 = time.monotonic_ns()
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            _api._add_wait(time.monotonic_ns() - self.t0)
        except Exception as err:
            _api._disable(f"writing the slot failed: {err!r}")


# torch.distributed's collectives, as users and FSDP2 call them (``dist.<name>``); absent names are skipped.
COLLECTIVES = (
    "all_gather", "all_gather_coalesced", "all_gather_into_tensor", "all_gather_object", "all_gather_single",
    "all_reduce", "all_reduce_coalesced", "all_to_all", "all_to_all_single", "barrier", "broadcast",
    "broadcast_object_list", "gather", "gather_object", "monitored_barrier", "reduce", "reduce_scatter",
    "reduce_scatter_single", "reduce_scatter_tensor", "scatter", "scatter_object_list",
)  # fmt: skip
_MAX_PENDING_EVENTS = 1024  # a GPU this far behind the host: new collectives go untimed until it catches up


class _HostWaits:
    """Waits as the host sees them: the call's wall time (gloo, MPI, CPU tensors)."""

    def begin(self) -> int:
        return time.monotonic_ns()

    def end(self, t0: int) -> None:
        _api._add_wait(time.monotonic_ns() - t0)


class _StreamWaits:
    """Waits as the GPU sees them (NCCL: the host only enqueues): a timing event on the calling stream before the
    call and after it; the stream reaches the second once the collective is over, so the pair's elapsed time is
    the stream's wait for the peers plus the transfer. Pairs are read when the GPU has passed them (``query``,
    no sync), so a wait lands in the step in which it is read: up to a step late, the same on every rank."""

    def __init__(self, cuda: Any) -> None:
        self.cuda = cuda
        self.pending: deque[tuple[Any, Any]] = deque()

    def begin(self) -> Any:
        if len(self.pending) >= _MAX_PENDING_EVENTS:
            return None
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def end(self, start: Any) -> None:
        if start is not None:
            stop = self.cuda.Event(enable_timing=True)
            stop.record()
            self.pending.append((start, stop))
        while self.pending and self.pending[0][1].query():
            first, last = self.pending.popleft()
            _api._add_wait(int(first.elapsed_time(last) * 1e6))


_IGNORED_GROUPS: list[Any] = []  # process groups whose collectives are nobody's wait (a checkpoint saver's own)


def ignore_group(group: Any) -> None:
    """Leave ``group``'s collectives (passed as ``group=``) out of the waits: a background checkpoint save's
    collectives overlap the training step and are nobody's wait for peers. ``CheckpointSaver`` calls it."""
    if group is not None and not any(group is g for g in _IGNORED_GROUPS):
        _IGNORED_GROUPS.append(group)


def _counted(fn: Callable[..., Any], clock: Any, depth: threading.local) -> Callable[..., Any]:
    """``fn`` with its duration added to the step's waits; a call made from inside a counted one (a blocking
    collective calling ``Work.wait``) is not counted again, nor a call on an ignored group (:func:`ignore_group`)."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        if getattr(depth, "n", 0):
            return fn(*args, **kwargs)
        group = kwargs.get("group")
        ignored = group is not None and any(group is g for g in _IGNORED_GROUPS)
        depth.n = 1  # what it calls (its own Work.wait) is inside it
        try:
            start = None if ignored else clock.begin()
        except Exception:  # noqa: BLE001 - the measure must never fail the collective
            start = None
        try:
            return fn(*args, **kwargs)
        finally:
            depth.n = 0
            if start is not None:
                try:
                    clock.end(start)
                except Exception:  # noqa: S110, BLE001 - same
                    pass

    counted.__wrapped__ = fn  # type: ignore[attr-defined]
    counted.__name__ = getattr(fn, "__name__", "collective")
    counted.__qualname__ = getattr(fn, "__qualname__", counted.__name__)
    counted.__doc__ = getattr(fn, "__doc__", None)
    return counted


_watched: list[tuple[Any, str, Any]] = []  # (owner, name, original): what unwatch_collectives() puts back


def watch_collectives() -> bool:
    """Measure this rank's waits in every ``torch.distributed`` collective (FSDP2, tensor/pipeline parallel
    loops, your own all-reduces): each blocking ``dist.<collective>(...)`` and each ``Work.wait()`` counts as
    waiting for peers. Call once, after ``init_process_group`` (the backend decides how waits are timed).
    Returns True when on; False when unsupervised or torch.distributed is not initialized (nothing changed)."""
    if not _api.is_supervised():
        return False
    import torch  # torch only here, when asked for
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        _api._warn_once("watch_collectives", "watch_collectives needs an initialized process group",
                        "call it after torch.distributed.init_process_group(...)")  # fmt: skip
        return False
    if _watched:
        return True
    nccl = "nccl" in str(dist.get_backend()).lower() and torch.cuda.is_available()
    clock: Any = _StreamWaits(torch.cuda) if nccl else _HostWaits()
    depth = threading.local()
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if callable(fn):
            _watched.append((dist, name, fn))
            setattr(dist, name, _counted(fn, clock, depth))
    work = getattr(dist, "Work", None) or getattr(dist.distributed_c10d, "Work", None)
    if work is not None:
        _watched.append((work, "wait", work.wait))
        work.wait = _counted(work.wait, clock, depth)
    _api._enable_waits()
    return True


def unwatch_collectives() -> None:
    """Put torch.distributed's own functions back (tests; a program that wants its collectives untouched)."""
    while _watched:
        owner, name, original = _watched.pop()
        setattr(owner, name, original)

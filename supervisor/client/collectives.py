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
* ``with waiting(): dist.all_reduce(...)``: for other collectives (a non-DDP loop, a metrics all-reduce placed
  where peers wait): the block's duration counts as waiting.

Both are no-ops when no supervisor runs the program. See docs/client.md, "Own time".
"""

from __future__ import annotations

import time
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

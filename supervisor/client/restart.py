"""Restart in the process: ``client.restartable(train)`` runs the training function again in the same process when
the supervisor orders a new generation, instead of the process ending and a new one starting cold.

WHY: a cold relaunch starts a new interpreter, imports torch, builds a CUDA context and a process group on every
rank, for one rank that died. When the training function raises (a peer died or was killed for hanging: gloo's
collectives fail with a connection error), a rank that runs under a supervisor giving restart orders
(``SUPERVISOR_WARM_RESTART=1``) does not exit: it prints the traceback as Python would, lets go of the failed
process group, says it waits (``RANK_FLAG_AWAITING_RESTART`` in its slot) and waits for the supervisor's order
(``restart_order``: the new rendezvous and where to resume). It then sets those variables in ``os.environ`` and
calls the function again, which builds its process group and loads its state as at any start (from the memory tier
when the supervisor picked a snapshot). Its interpreter, imports and loaded libraries stay.

Letting go matters: the failed process group's sockets must close so that peers still blocked in a collective with
this rank fail too (gloo: a connection closed) and join the wait. So the exception's traceback (which holds the
function's frames: the model, the DDP reducer, the process group) is dropped, ``destroy_process_group`` runs and
the garbage is collected before waiting. That is not always enough: a gloo group can outlive its destruction
(seen with a rank whose own code raised: its peers stayed blocked on it until it exited), so the supervisor kills a
rank that waits while its peers stay stuck (``decisions.warm_restart.holding_back``) and starts it again. No order
before the deadline (``SUPERVISOR_RESTART_WAIT_S``, 60 s), or a
supervisor that gives none, or a stop request (SIGTERM, the supervisor's stop flag) while waiting: the exception is
raised again and the process ends as without the wrapper, which the
supervisor answers with a cold relaunch. ``SystemExit`` and ``KeyboardInterrupt`` are never caught.

Stdlib only; torch.distributed is used only when the program already imported it.
"""

from __future__ import annotations

import functools
import gc
import importlib
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from supervisor.client import api, store_wait
from supervisor.client import layout as _layout
from supervisor.client.restart_order import ENV_GENERATION, ENV_WAIT_S, ENV_WARM, RestartOrder, read_order

DEFAULT_WAIT_S = 60.0
POLL_S = 0.02  # how often a waiting rank looks for its order (a stat and a small read)

T = TypeVar("T")


def generation() -> int:
    """How many times this launch restarted in process (0 at a launch; a replacement rank starts in the generation
    it joins). Unsupervised: 0."""
    value = os.environ.get(ENV_GENERATION, "").strip()
    return int(value) if value.isdigit() and len(value) < 10 else 0


def restartable(fn: Callable[..., T]) -> Callable[..., T]:
    """Wrap the training function (the part that builds the process group, loads the state and trains) so that a
    supervisor can restart it in this process. Without a supervisor, or one that gives no restart orders, the
    wrapped function behaves exactly as ``fn``."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        bound = api._bound()
        if bound is not None:
            _flag(bound[0], _layout.RANK_FLAG_RESTARTABLE, True)
            if os.environ.get(ENV_WARM) == "1":
                _import_dynamo_first()
        while True:
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                if bound is None or os.environ.get(ENV_WARM) != "1":
                    raise
                failure = _report(exc)
            else:
                if bound is not None:  # the training ended well (the supervisor cannot always learn an exit code)
                    _flag(bound[0], _layout.RANK_FLAG_RETURNED, True)
                return result
            order = _wait_for_order(bound, failure)
            if order is None:
                raise failure  # as the process would have ended without us (its traceback was printed)
            order.apply(os.environ)
            _say(f"restarting in this process in generation {order.generation} "
                 f"(rendezvous {os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')})")  # fmt: skip
            store_wait.wait_for_store()  # (no back-off sleep in the program's own connect: client/store_wait.py)
            try:
                api._enter_phase(_layout.PHASE_INIT)  # as a new process: init until the first step
            except Exception:  # noqa: S110 - the slot went away: the client is a no-op, training goes on
                pass

    return run


def _report(exc: BaseException) -> BaseException:
    """Print the traceback as an uncaught exception would (the supervisor's log reading needs it), then strip every
    traceback from the exception chain so nothing keeps the function's frames (and its process group) alive."""
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        link.__traceback__ = None
        link = link.__cause__ or link.__context__
    return exc


def _import_dynamo_first() -> None:
    """Import ``torch._dynamo`` before the training function builds its process group, when the program uses torch.

    WHY: a gloo group created *before* ``torch._dynamo`` is imported (which creating an optimizer does) keeps its
    connections after ``destroy_process_group`` (and ``_abort_process_group``) until the process ends: something
    dynamo's import sets up holds it from C++. A waiting rank then blocks the peers that still exchange with it,
    and those block theirs: measured with torch 2.13 (an optimizer created after ``init_process_group``: the peer
    released at the failed rank's exit, 6 s later, its 3 sockets and 3 threads kept; dynamo imported first: the
    sockets closed at the release, the peer failed within 0.1 s), and seen on Slurm as a whole torchrun launch's
    survivors stalled. The import costs what the program's first optimizer would pay anyway. A program that
    builds its group before calling the wrapped function keeps that first group's behaviour (docs/client.md)."""
    if "torch" not in sys.modules:  # not a torch program (or not yet): nothing of torch's to hold a group
        return
    try:
        importlib.import_module("torch._dynamo")
    except Exception as exc:  # a torch without dynamo (or a broken one): the release may then be slower
        _say(f"importing torch._dynamo before the training raised {exc!r}; going on")


def _release_process_group() -> None:
    """Let go of torch.distributed's groups so their connections close (peers blocked on this rank fail and join
    the restart); failures here are the failed group's and change nothing.

    Aborted first (``_abort_process_group``, torch 2.4+: NCCL communicators are aborted, which a destroy alone does
    not do), then destroyed if still registered. A gloo group's connections close only when its last reference
    goes; seen on the local cluster (and reproduced outside it, with a model and an optimizer, in some runs and
    not others): they stayed open until the process ended, its peers blocked on it meanwhile. The supervisor copes
    (``decisions/warm_restart``: ``holding_back``, ``hung_by_peers``); nothing here can close them."""
    gc.collect()  # the function's frames, freed now that no traceback holds them
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if not (dist.is_available() and dist.is_initialized()):
            return
    except Exception:  # noqa: S110 - a torch without distributed support: nothing to release
        return
    abort = getattr(getattr(dist, "distributed_c10d", None), "_abort_process_group", None)
    if callable(abort):
        try:
            abort()
        except Exception as exc:  # the group is broken already: that is why we are here
            _say(f"aborting the failed process group raised {exc!r}; going on")
    try:
        if dist.is_initialized():  # no abort in this torch, or it left the group registered
            dist.destroy_process_group()
    except Exception as exc:
        _say(f"destroying the failed process group raised {exc!r}; going on")
    gc.collect()


def _wait_for_order(bound: tuple[Any, Any], failure: BaseException) -> RestartOrder | None:
    """Release the process group, then wait for an order newer than this rank's generation, marked as waiting in
    the slot; None at the deadline."""
    writer, slot_dir = bound
    current = generation()
    peer = collective_failure(failure)
    if peer:
        _flag(writer, _layout.RANK_FLAG_PEER_FAILED, True)
    _flag(writer, _layout.RANK_FLAG_AWAITING_RESTART, True)
    try:
        _release_process_group()
        wait_s = _wait_s()
        _say(f"{type(failure).__name__} in generation {current}; waiting up to {wait_s:g} s for the supervisor's "
             "restart order")  # fmt: skip
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            order = read_order(slot_dir)
            if order is not None and order.generation > current:
                return order
            if api.should_stop():  # the job is being stopped (preemption, cancel, SIGTERM): no restart is coming
                _say("asked to stop while waiting for a restart order: the process ends")
                return None
            time.sleep(POLL_S)
        _say(f"no restart order within {wait_s:g} s: the process ends (the supervisor relaunches it)")
        return None
    finally:
        _flag(writer, _layout.RANK_FLAG_AWAITING_RESTART, False)
        if peer:
            _flag(writer, _layout.RANK_FLAG_PEER_FAILED, False)


# What torch.distributed raises when a collective fails because of a peer (its errors' classes, and the text of the
# RuntimeErrors older backends raise); matched by name so the client needs no torch.
DIST_ERROR_NAMES = frozenset({"DistError", "DistBackendError", "DistNetworkError", "DistStoreError"})
PEER_FAILURE_TEXT = ("gloo/transport", "Connection closed by peer", "Connection reset by peer", "ProcessGroupGloo",
                     "ProcessGroupNCCL", "NCCL error", "Socket Timeout", "Timed out waiting")  # fmt: skip


def collective_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it was raised from) is a collective's failure caused by a peer rather than this
    rank's own error: the supervisor then never takes this rank for the one holding the others back
    (``decisions.warm_restart.holding_back``), and a peer that neither steps nor waits is the hung one."""
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        if any(k.__name__ in DIST_ERROR_NAMES for k in type(link).__mro__):
            return True
        if isinstance(link, RuntimeError) and any(t in str(link) for t in PEER_FAILURE_TEXT):
            return True
        link = link.__cause__ or link.__context__
    return False


def _flag(writer: Any, flag: int, on: bool) -> None:
    """Set or clear one of this rank's flags; a slot that went away (the client disabled) changes nothing."""
    try:
        (writer.set_async_flag if on else writer.clear_async_flag)(flag)
    except Exception:  # noqa: S110 - the supervisor then sees no flag: at worst it relaunches cold
        pass


def _wait_s() -> float:
    try:
        value = float(os.environ.get(ENV_WAIT_S, "") or DEFAULT_WAIT_S)
    except ValueError:
        return DEFAULT_WAIT_S
    return value if 0 < value < 86400 else DEFAULT_WAIT_S


def _say(text: str) -> None:
    rank = os.environ.get("RANK") or os.environ.get("SLURM_PROCID") or "?"
    try:
        sys.stderr.write(f"supervisor.client: rank {rank}: {text}\n")
        sys.stderr.flush()
    except Exception:  # noqa: S110 - a closed stderr must not break the restart
        pass

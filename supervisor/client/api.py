"""The training-side API: ``step``, ``phase``, ``should_checkpoint``, ``should_stop``, ``resume_from``.

WHY lazy and forgiving: this code runs inside every training rank. The first call finds out
whether a supervisor is present (``SUPERVISOR_SLOT_DIR``) and maps the rank's slot; without one
every call is a cheap no-op. A supervisor-side problem (slot directory gone, bad permissions)
must never stop training: the client warns once on stderr and carries on as a no-op.
"""

from __future__ import annotations

import _thread
import atexit
import faulthandler
import operator
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from supervisor import paths as _paths
from supervisor.client import slot as _slot

ENV_SLOT_DIR = _paths.SLOT_DIR_ENV
ENV_RESUME_FROM = "SUPERVISOR_RESUME_FROM"

_init_lock = _thread.RLock()
_initializing = False  # True while _init runs: a signal handler calling us then gets a no-op
_writer: _slot.SlotWriter | None = None
_slot_dir: Path | None = None  # this rank's slot directory once the client is bound to it
_stacks_file: TextIO | None = None
_prev_sigterm: Any = None
_defer_sigterm = False
_warned: set[str] = set()


def _warn_once(key: str, problem: str, fix: str) -> None:
    if key in _warned:
        return
    _warned.add(key)
    try:
        sys.stderr.write(f"supervisor.client: warning: {problem} (fix: {fix})\n")
        sys.stderr.flush()
    except Exception:  # noqa: S110 - a closed stderr must not break training either
        pass


# --- the current bindings: lazy initialisers, then the writer's closures or no-ops -------------


def _noop_beat(i: object, loss: object) -> None:
    return None


def _false() -> bool:
    return False


def _noop_enter(code: int) -> int:
    return code


def _noop_exit(code: int, previous: int, completed: bool) -> None:
    return None


def _lazy_beat(i: Any, loss: Any) -> None:
    if _init():
        _beat(i, loss)


def _lazy_should_checkpoint() -> bool:
    return _init() and _should_checkpoint()


def _lazy_should_stop() -> bool:
    return _init() and _should_stop()


def _lazy_enter(code: int) -> int:
    return _enter_phase(code) if _init() else code


def _noop_add_wait(ns: int) -> None:
    return None


def _lazy_add_wait(ns: int) -> None:
    if _init():
        _add_wait(ns)


def _lazy_enable_waits() -> None:
    if _init():
        _enable_waits()


_beat: Callable[[Any, Any], None] = _lazy_beat
_should_checkpoint: Callable[[], bool] = _lazy_should_checkpoint
_should_stop: Callable[[], bool] = _lazy_should_stop
_enter_phase: Callable[[int], int] = _lazy_enter
_exit_phase: Callable[[int, int, bool], None] = _noop_exit
# Collective waits (supervisor.client.collectives): add ns to the step in progress; claim the wait ring.
_add_wait: Callable[[int], None] = _lazy_add_wait
_enable_waits: Callable[[], None] = _lazy_enable_waits


def _noop_enable_waits() -> None:
    return None


def _bind_noop() -> None:
    global _beat, _should_checkpoint, _should_stop, _enter_phase, _exit_phase, _add_wait, _enable_waits
    _beat, _should_checkpoint, _should_stop = _noop_beat, _false, _false
    _enter_phase, _exit_phase = _noop_enter, _noop_exit
    _add_wait, _enable_waits = _noop_add_wait, _noop_enable_waits
    _set_public_step(step)


def _set_public_step(fn: Callable[..., None]) -> None:
    """Point ``supervisor.client.step`` straight at the writer's beat (it handles its own errors),
    saving a wrapper call on the hot path; ``from supervisor.client import step`` keeps the
    wrapper, which stays correct."""
    package = sys.modules.get("supervisor.client")
    if package is not None:
        package.step = fn  # type: ignore[attr-defined]


def _disable(problem: str) -> None:
    """Stop publishing (keep the file: the agent may still read the last record)."""
    global _writer
    _bind_noop()
    _writer = None
    _warn_once("disabled", f"{problem}; training continues without supervisor heartbeats",
               "check the node agent and SUPERVISOR_SLOT_DIR; restart the step to resume heartbeats")  # fmt: skip


def _env_int(names: tuple[str, ...], default: int) -> int:
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return int(value)
    return default


def _init() -> bool:
    """Bind the API to a slot writer or to no-ops. False only when re-entered (a signal handler
    calling the client while this thread initialises it): that call is skipped."""
    global _initializing
    with _init_lock:
        if _beat is not _lazy_beat:
            return True  # another thread won the race
        if _initializing:
            return False
        _initializing = True
        try:
            _init_locked()
        except Exception as exc:  # a bug here must not reach the training loop either
            _disable(f"client initialisation failed: {exc!r}")
        finally:
            _initializing = False
        return True


def _init_locked() -> None:
    global _writer, _slot_dir, _beat, _should_checkpoint, _should_stop, _enter_phase, _exit_phase
    global _add_wait, _enable_waits
    slot_dir = os.environ.get(ENV_SLOT_DIR, "")
    if not slot_dir:
        _bind_noop()
        return
    # One srun line serves every node: the agent and the rank fill in the node name the same way, so
    # several slurmd sharing one host (the local test cluster) never share a slot directory.
    node = os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    slot_dir = str(_paths.expand_slot_dir(slot_dir, job=os.environ.get("SLURM_JOB_ID", ""), node=node))
    try:
        # torchrun's RANK wins over SLURM_PROCID: under `srun torchrun`, PROCID numbers nodes.
        rank = _env_int(("RANK", "SLURM_PROCID"), 0)
        local_rank = _env_int(("LOCAL_RANK", "SLURM_LOCALID"), 0)
        world_size = _env_int(("WORLD_SIZE", "SLURM_NTASKS"), 1)
    except ValueError as exc:
        _bind_noop()
        _warn_once("env", f"bad rank variable ({exc})", "set RANK/SLURM_PROCID to integers")
        return
    try:
        _slot.check_slot_dir(Path(slot_dir))
        writer = _slot.SlotWriter.create(slot_dir, rank, local_rank, world_size, on_error=_step_failed)
    except OSError as exc:
        _bind_noop()
        _warn_once("slot", f"cannot use {ENV_SLOT_DIR}={slot_dir}: {exc}; running unsupervised",
                   "make the node agent create it (mode 0700, owned by this user), or unset it")  # fmt: skip
        return
    _writer, _slot_dir = writer, Path(slot_dir)
    _beat, _should_checkpoint, _should_stop = writer.beat, writer.should_checkpoint, writer.should_stop
    _enter_phase, _exit_phase = writer.enter_phase, writer.exit_phase
    _add_wait, _enable_waits = _guarded_add_wait(writer.add_wait), writer.enable_waits
    _set_public_step(writer.beat)
    _install_process_hooks(writer, Path(slot_dir), rank)


def _install_process_hooks(writer: _slot.SlotWriter, slot_dir: Path, rank: int) -> None:
    global _stacks_file, _prev_sigterm
    try:
        fd = _slot._open_private(_slot.stacks_path(slot_dir, rank), os.O_WRONLY | os.O_APPEND)
        os.ftruncate(fd, 0)
        _stacks_file = os.fdopen(fd, "w")
        faulthandler.register(_slot.STACK_DUMP_SIGNAL, file=_stacks_file, all_threads=True, chain=False)
        writer.set_async_flag(_slot.RANK_FLAG_STACK_DUMPS)
    except (OSError, ValueError, RuntimeError) as exc:
        _warn_once("stacks", f"stack dumps on request are unavailable: {exc}", "check SUPERVISOR_SLOT_DIR")
    try:
        previous = signal.getsignal(signal.SIGTERM)
        if previous is not None:  # None: a handler installed from C that we could not chain to
            signal.signal(signal.SIGTERM, _on_sigterm)
            _prev_sigterm = previous
    except ValueError:
        pass  # first call came from a non-main thread: SIGTERM is not recorded (documented)
    atexit.register(_on_exit)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _guarded_add_wait(add: Callable[[int], None]) -> Callable[[int], None]:
    """``add_wait`` runs in comm-hook callbacks (another thread): a vanished mapping must stop publishing,
    never fail the all-reduce."""

    def add_wait(ns: int) -> None:
        try:
            add(ns)
        except Exception as exc:
            _disable(f"writing the slot failed: {exc!r}")

    return add_wait


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    """Record SIGTERM in the slot, then behave as the program would have without us."""
    writer = _writer
    if writer is not None:
        try:
            writer.set_async_flag(_slot.RANK_FLAG_SIGTERM)
        except Exception:  # noqa: S110 - never fail inside a signal handler
            pass
    previous = _prev_sigterm
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN or _defer_sigterm:
        return
    else:  # SIG_DFL: terminate by SIGTERM, so exit status and Slurm see the real cause
        if writer is not None:
            try:
                writer.finish()  # we may have interrupted a write: leave the record complete
            except Exception:  # noqa: S110 - dying anyway
                pass
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _on_exit() -> None:
    """At interpreter exit: EXITING, and ENDED_CLEAN unless an exception went unhandled (the interpreter sets
    ``sys.last_value`` when it prints one, before atexit runs). A crash after this (a library's destructor at
    teardown: gloo's abort, a CUDA context's segfault) then costs no training and blames nobody."""
    writer = _writer
    if writer is not None:
        clean = getattr(sys, "last_value", None) is None and getattr(sys, "last_exc", None) is None
        try:
            writer.set_async_flag(_slot.RANK_FLAG_EXITING | (_slot.RANK_FLAG_ENDED_CLEAN if clean else 0))
        except Exception:  # noqa: S110 - interpreter shutdown: nothing useful to do
            pass


def _after_fork_in_child() -> None:
    """A forked child (e.g. a DataLoader worker) is not the rank: it must not write the slot."""
    global _writer
    _writer = None
    _bind_noop()


# --- public API ---------------------------------------------------------------------------------


def step(i: int, loss: float | None = None) -> None:
    """Mark the end of training iteration ``i`` (the heartbeat). ``loss`` is optional: pass a
    Python float you already have; a tensor is converted with ``.item()``, which waits for the
    GPU (a CUDA sync) - avoid that on the hot path. NaN and Inf are recorded as such."""
    try:
        _beat(i, loss)
    except Exception as exc:  # the writer handles its own errors; this is a last resort
        _disable(f"client.step failed: {exc!r}")


def _step_failed(exc: Exception, i: Any, loss: Any) -> None:
    """The writer's error hook: fix up a bad argument (warn once), or stop publishing."""
    if _writer is None:
        return
    if i.__class__ is int and (loss is None or loss.__class__ is float):
        _disable(f"writing the slot failed: {exc!r}")  # the arguments were fine: the slot is not
        return
    try:
        good_i = int(i) if isinstance(i, float) and i.is_integer() else operator.index(i)
    except Exception:
        _warn_once("step-arg", f"client.step(i=...) needs an int step, got {type(i).__name__}",
                   "pass the iteration number as an int")  # fmt: skip
        return
    good_loss: float | None
    try:
        good_loss = None if loss is None else float(loss)
    except Exception as bad:
        good_loss = None
        _warn_once("loss-arg", f"client.step(loss=...) needs a float, got {type(loss).__name__}: {bad}",
                   "pass a Python float (e.g. loss.item() of a 0-d tensor) or None")  # fmt: skip
    _beat(good_i, good_loss)


def should_checkpoint() -> bool:
    """True while the supervisor asks for a checkpoint this rank has not yet made; a completed
    ``with phase("checkpoint"):`` block acknowledges it. Reads shared memory only."""
    try:
        return _should_checkpoint()
    except Exception as exc:
        _disable(f"reading the slot failed: {exc!r}")
        return False


def should_stop() -> bool:
    """True once the supervisor asks this rank to checkpoint and stop, or after SIGTERM."""
    try:
        return _should_stop()
    except Exception as exc:
        _disable(f"reading the slot failed: {exc!r}")
        return False


def resume_from() -> str | None:
    """The checkpoint the supervisor validated for this attempt, or None (fresh start/unsupervised)."""
    return os.environ.get(ENV_RESUME_FROM) or None


def _bound() -> tuple[_slot.SlotWriter, Path] | None:
    """This rank's slot writer and directory (initialising the client if needed), or None unsupervised."""
    if _beat is _lazy_beat:
        _init()
    writer, slot_dir = _writer, _slot_dir
    return None if writer is None or slot_dir is None else (writer, slot_dir)


def is_supervised() -> bool:
    """Whether this rank publishes to a supervisor's slot (initialising the client if needed)."""
    if _beat is _lazy_beat:
        _init()
    return _writer is not None


def defer_sigterm() -> None:
    """Opt in to graceful stops: SIGTERM no longer kills the process at once (when nothing else
    handles it); instead ``should_stop()`` turns True and the loop checkpoints and exits. Slurm's
    SIGKILL after KillWait stays the backstop. Call it from the main thread before training."""
    global _defer_sigterm
    _defer_sigterm = True
    is_supervised()


class phase:  # noqa: N801 - used like a function: `with client.phase("checkpoint"):`
    """Enter a phase now; as a context manager, return to the previous phase on exit. Phases:
    init, step, checkpoint, eval, restore, data, other. Leaving a ``checkpoint`` block without an
    exception acknowledges pending checkpoint requests."""

    __slots__ = ("code", "previous")

    def __init__(self, name: str) -> None:
        code = _slot.PHASE_CODES.get(name)
        if code is None:
            raise ValueError(f"unknown phase {name!r}; use one of {', '.join(_slot.PHASES)}")
        self.code = code
        try:
            self.previous = _enter_phase(code)
        except Exception as exc:
            self.previous = code
            _disable(f"writing the slot failed: {exc!r}")

    def __enter__(self) -> phase:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            _exit_phase(self.code, self.previous, exc_type is None)
        except Exception as err:
            _disable(f"writing the slot failed: {err!r}")


def _reset_for_tests() -> None:
    """Forget the binding so the next call re-reads the environment (tests only)."""
    global _writer, _beat, _should_checkpoint, _should_stop, _enter_phase, _exit_phase, _stacks_file
    global _prev_sigterm, _defer_sigterm, _add_wait, _enable_waits, _slot_dir
    if _writer is not None:
        _writer.close()
    if _prev_sigterm is not None and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, _prev_sigterm)
    if _stacks_file is not None:
        faulthandler.unregister(_slot.STACK_DUMP_SIGNAL)
        _stacks_file.close()
    atexit.unregister(_on_exit)
    _writer, _stacks_file, _prev_sigterm, _defer_sigterm = None, None, None, False
    _slot_dir = None
    _beat, _should_checkpoint, _should_stop = _lazy_beat, _lazy_should_checkpoint, _lazy_should_stop
    _enter_phase, _exit_phase = _lazy_enter, _noop_exit
    _add_wait, _enable_waits = _lazy_add_wait, _lazy_enable_waits
    _set_public_step(step)
    _warned.clear()

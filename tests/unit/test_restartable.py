"""``client.restartable``: a training function that raises under a supervisor giving restart orders waits, marked
in its slot, for the order, lets go of what the failed attempt held, and runs again in the same process with the
order's variables; without an order (or a supervisor) the exception ends the process as it would without us."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref
from pathlib import Path

import pytest

from supervisor import client
from supervisor.client import slot as S
from supervisor.client.restart_order import ENV_GENERATION, ENV_WAIT_S, ENV_WARM, RestartOrder, write_order


class Held:
    """Stands in for what a failed attempt holds (a model, a process group)."""


def _flags(slot_dir: Path) -> int:
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None
    return rec.rank_flags


def _wait_for_flag(slot_dir: Path, flag: int, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if S.slot_path(slot_dir, 0).exists() and _flags(slot_dir) & flag:
            return True
        time.sleep(0.01)
    return False


@pytest.fixture
def warm(slot_dir: Path, env: pytest.MonkeyPatch) -> Path:
    for name in (ENV_GENERATION, "MASTER_PORT"):
        env.delenv(name, raising=False)
    env.setenv(ENV_WARM, "1")
    env.setenv(ENV_WAIT_S, "20")
    return slot_dir


def test_unsupervised_the_function_is_the_function(env: pytest.MonkeyPatch) -> None:
    calls = []

    @client.restartable
    def train(x: int) -> int:
        calls.append(x)
        if x < 0:
            raise RuntimeError("peer gone")
        return x * 2

    assert train(21) == 42
    with pytest.raises(RuntimeError, match="peer gone"):
        train(-1)
    assert calls == [21, -1] and client.generation() == 0


def test_a_supervisor_without_restart_orders_gets_the_exception_at_once(slot_dir: Path, env: pytest.MonkeyPatch) -> None:
    env.delenv(ENV_WARM, raising=False)

    @client.restartable
    def train() -> None:
        client.step(1)
        raise RuntimeError("peer gone")

    started = time.monotonic()
    with pytest.raises(RuntimeError, match="peer gone"):
        train()
    assert time.monotonic() - started < 5
    assert _flags(slot_dir) & S.RANK_FLAG_RESTARTABLE  # the supervisor can see the program would restart in place
    assert not _flags(slot_dir) & S.RANK_FLAG_AWAITING_RESTART


def test_a_failed_attempt_waits_for_its_order_then_runs_again_with_it(
    warm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[tuple[int, str | None]] = []
    held: list[weakref.ref[Held]] = []
    freed_before_order: list[bool] = []
    peer_failed: list[bool] = []

    @client.restartable
    def train(steps: int) -> str:
        seen.append((client.generation(), os.environ.get("MASTER_PORT")))
        model = Held()
        held.append(weakref.ref(model))
        client.step(steps)
        if len(seen) == 1:
            raise RuntimeError("Connection closed by peer")
        return "done"

    def supervisor() -> None:
        assert _wait_for_flag(warm, S.RANK_FLAG_AWAITING_RESTART)
        peer_failed.append(bool(_flags(warm) & S.RANK_FLAG_PEER_FAILED))
        gc.collect()
        freed_before_order.append(held[0]() is None)
        write_order(warm, RestartOrder(1, {"MASTER_PORT": "29123"}))

    helper = threading.Thread(target=supervisor)
    helper.start()
    assert train(5) == "done"
    helper.join()
    assert seen == [(0, None), (1, "29123")]
    assert freed_before_order == [True]  # the failed attempt's objects were let go before the wait
    assert not _flags(warm) & (S.RANK_FLAG_AWAITING_RESTART | S.RANK_FLAG_PEER_FAILED)
    assert peer_failed == [True], "a closed connection is a peer's failure: the supervisor must not kill this rank"
    assert client.generation() == 1
    err = capsys.readouterr().err
    assert "RuntimeError: Connection closed by peer" in err  # the traceback, as an uncaught exception prints it
    assert "restarting in this process in generation 1" in err


def test_no_order_before_the_deadline_ends_with_the_original_exception(warm: Path, env: pytest.MonkeyPatch) -> None:
    env.setenv(ENV_WAIT_S, "0.3")
    write_order(warm, RestartOrder(1, {"MASTER_PORT": "1"}))
    env.setenv(ENV_GENERATION, "1")  # that order is this rank's own generation: stale, not a new one
    calls = []

    @client.restartable
    def train() -> None:
        calls.append(1)
        raise ConnectionError("peer gone")

    with pytest.raises(ConnectionError, match="peer gone"):
        train()
    assert calls == [1]
    assert not _flags(warm) & S.RANK_FLAG_AWAITING_RESTART


@pytest.mark.parametrize("exc", [SystemExit(3), KeyboardInterrupt()])
def test_exits_and_interrupts_are_never_caught(warm: Path, exc: BaseException) -> None:
    @client.restartable
    def train() -> None:
        raise exc

    started = time.monotonic()
    with pytest.raises(type(exc)):
        train()
    assert time.monotonic() - started < 5


def test_a_stop_request_while_waiting_ends_the_wait_at_once(warm: Path) -> None:
    """Preemption or a cancel while the ranks wait for their order: no restart is coming, the process must end
    (and Slurm's SIGKILL after KillWait must not be what ends it)."""

    @client.restartable
    def train() -> None:
        client.step(3)
        raise ConnectionError("peer gone")

    def stop_it() -> None:
        assert _wait_for_flag(warm, S.RANK_FLAG_AWAITING_RESTART)
        with S.open_slot_for_reading(S.slot_path(warm, 0)) as reader:
            assert reader.set_control_flags(S.FLAG_STOP)

    helper = threading.Thread(target=stop_it)
    helper.start()
    started = time.monotonic()
    with pytest.raises(ConnectionError):
        train()  # the fixture's wait is 20 s
    helper.join()
    assert time.monotonic() - started < 10


def test_a_collective_failure_is_told_from_the_ranks_own_error() -> None:
    from supervisor.client.restart import collective_failure

    class DistBackendError(RuntimeError):  # torch.distributed's, matched by name (the client imports no torch)
        pass

    gloo = RuntimeError("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 10000ms")
    assert collective_failure(gloo) and collective_failure(DistBackendError("NCCL communicator was aborted"))
    wrapped = ValueError("while averaging gradients")
    wrapped.__cause__ = RuntimeError("Connection reset by peer")
    assert collective_failure(wrapped)
    for own in (ValueError("a bad sample at step 12"), RuntimeError("CUDA out of memory"), KeyError("x")):
        assert not collective_failure(own), own
    loop = ValueError("a")
    loop.__context__ = loop  # a cycle ends the walk
    assert not collective_failure(loop)


def test_a_rank_waiting_on_its_own_error_is_not_marked_peer_failed(warm: Path) -> None:
    marked: list[bool] = []

    @client.restartable
    def train() -> str:
        if client.generation() == 0:
            raise ValueError("a bad sample")
        return "ok"

    def supervisor() -> None:
        assert _wait_for_flag(warm, S.RANK_FLAG_AWAITING_RESTART)
        marked.append(bool(_flags(warm) & S.RANK_FLAG_PEER_FAILED))
        write_order(warm, RestartOrder(1, {}))

    helper = threading.Thread(target=supervisor)
    helper.start()
    assert train() == "ok"
    helper.join()
    assert marked == [False]

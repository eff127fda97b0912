"""Own time per step (step time less collective waits): the slot's wait ring as the reader decodes it, driven
by a scripted clock; the DDP comm-hook wrapper with fake buckets and futures; ``watch_ddp``/``waiting`` through
the public API; and one real (single-process, gloo) DDP model, because DDP checks a hook's signature itself."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor import client
from supervisor.client import api, collectives
from supervisor.client import slot as S
from supervisor.client.layout import WAIT_NS_MASK


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000_000

    def __call__(self) -> int:
        return self.now


def _writer(d: Path, c: Clock) -> S.SlotWriter:
    real = time.monotonic_ns
    time.monotonic_ns = c  # type: ignore[assignment]  # the writer binds the clock when created
    try:
        return S.SlotWriter.create(d, 0, 0, 1)
    finally:
        time.monotonic_ns = real  # type: ignore[assignment]


steps = st.lists(st.tuples(st.integers(1, 10**11), st.lists(st.integers(0, 10**11), max_size=3)), min_size=1,
                 max_size=60)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(steps=steps)
def test_own_time_is_the_step_time_less_that_steps_waits(tmp_path_factory: pytest.TempPathFactory,
                                                          steps: list[tuple[int, list[int]]]) -> None:  # fmt: skip
    c = Clock()
    d = tmp_path_factory.mktemp("slots")
    w = _writer(d, c)
    w.enable_waits()
    w.beat(0, None)
    expected = []
    for i, (dt, waits) in enumerate(steps, start=1):
        for ns in waits:  # several collectives in one step add up
            w.add_wait(ns)
        c.now += dt
        w.beat(i, None)
        expected.append(max(0, dt - min(sum(waits), WAIT_NS_MASK)))
    rec = S.read_slot(S.slot_path(d, 0))
    assert rec is not None
    assert rec.recent_own_ns == tuple(expected[-(S.WAIT_RING) :])
    assert rec.own_ewma_ns == S.iteration_stats(rec.recent_own_ns)[0]
    assert rec.recent_iter_ns[-len(rec.recent_own_ns) :] == tuple(dt for dt, _ in steps[-(S.WAIT_RING) :])
    w.close()


def test_no_own_time_without_the_flag_and_a_stale_wait_is_not_reused(tmp_path: Path) -> None:
    c = Clock()
    w = _writer(tmp_path, c)
    w.beat(0, None)
    w.add_wait(50)  # measured, but the rank never claimed the ring: the reader ignores it
    c.now += 100
    w.beat(1, None)
    rec = S.read_slot(S.slot_path(tmp_path, 0))
    assert rec is not None and rec.recent_own_ns == () and rec.own_ewma_ns == 0
    w.enable_waits()
    for i in range(2, 2 + S.WAIT_RING):  # no waits: own time = step time; the entry from beat 2 is now stale
        c.now += 100
        w.beat(i, None)
    rec = S.read_slot(S.slot_path(tmp_path, 0))
    assert rec is not None and set(rec.recent_own_ns) == {100} and rec.own_ewma_ns == 100
    assert rec.rank_flags & S.RANK_FLAG_WAITS
    w.close()


class FakeFuture:
    def __init__(self, value: Any = "grads", error: Exception | None = None) -> None:
        self._value, self._error = value, error
        self.callbacks: list[Any] = []

    def then(self, fn: Any) -> FakeFuture:
        self.callbacks.append(fn)
        return self

    def value(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._value

    def complete(self) -> list[Any]:
        return [fn(self) for fn in self.callbacks]


class Bucket:
    def __init__(self, last: bool) -> None:
        self.last = last

    def is_last(self) -> bool:
        return self.last


@pytest.fixture
def waits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    got: list[int] = []
    monkeypatch.setattr(api, "_add_wait", got.append)
    return got


def test_the_hook_stamps_the_last_buckets_wait_only(waits: list[int]) -> None:
    c = Clock()
    seen: list[tuple[Any, Any]] = []
    futures: list[FakeFuture] = []

    def inner(state: Any, bucket: Any) -> FakeFuture:
        seen.append((state, bucket))
        futures.append(FakeFuture())
        return futures[-1]

    hook = collectives._timed(inner, c)
    first, last = Bucket(False), Bucket(True)
    assert hook("pg", first) is futures[0] and futures[0].callbacks == []  # untouched: overlapped with compute
    c.now += 1000
    hook("pg", last)
    c.now += 250_000  # the peers arrive
    assert futures[1].complete() == ["grads"] and waits == [250_000]
    assert seen == [("pg", first), ("pg", last)]


def test_the_collectives_error_reaches_ddp_and_a_broken_slot_never_does(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(ns: int) -> None:
        raise ValueError("mapping closed")

    monkeypatch.setattr(api, "_add_wait", broken)
    fut = FakeFuture(error=RuntimeError("Connection closed by peer"))
    hook = collectives._timed(lambda state, bucket: fut)
    hook(None, Bucket(True))
    with pytest.raises(RuntimeError, match="closed by peer"):
        fut.complete()
    ok = FakeFuture()
    collectives._timed(lambda state, bucket: ok)(None, Bucket(True))
    assert ok.complete() == ["grads"]


@pytest.fixture
def fake_ddp(monkeypatch: pytest.MonkeyPatch) -> type:
    """A stand-in that passes watch_ddp's isinstance check (torch is there; DDP itself needs a process group)."""
    parallel = pytest.importorskip("torch.nn.parallel")
    monkeypatch.setattr(parallel, "DistributedDataParallel", FakeDDP)
    return FakeDDP


class FakeDDP:
    def __init__(self, refuse: str = "") -> None:
        self.refuse = refuse
        self.hooks: list[tuple[Any, Any]] = []

    def register_comm_hook(self, state: Any, hook: Any) -> None:
        if self.refuse:
            raise RuntimeError(self.refuse)
        self.hooks.append((state, hook))


def test_unsupervised_watch_ddp_changes_nothing(env: pytest.MonkeyPatch) -> None:
    model = FakeDDP()
    assert client.watch_ddp(model) is False and model.hooks == []
    with client.waiting():
        pass


def test_watch_ddp_wraps_the_users_hook_and_claims_the_wait_ring(slot_dir: Path, fake_ddp: type,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    model = FakeDDP()
    mine = FakeFuture()
    assert client.watch_ddp(model, hook=lambda state, bucket: mine, state="my-state") is True
    ((state, hook),) = model.hooks
    assert state == "my-state" and "supervisor_timed" in hook.__qualname__
    client.step(0)
    hook(state, Bucket(True))
    time.sleep(0.002)
    mine.complete()
    time.sleep(0.003)
    client.step(1)
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None and rec.rank_flags & S.RANK_FLAG_WAITS
    (own,) = rec.recent_own_ns
    assert 0 < own <= rec.recent_iter_ns[-1] - 2_000_000
    # DDP refusing (a hook is already registered) or no DDP model (FSDP's hooks take a gradient, not a bucket):
    # a warning, training goes on, False.
    assert client.watch_ddp(FakeDDP("register_comm_hook can only be called once")) is False
    err = capsys.readouterr().err
    assert err.count("supervisor.client: warning") == 1 and "only be called once" in err
    api._warned.clear()
    not_ddp = type("FullyShardedDataParallel", (), {"register_comm_hook": FakeDDP.register_comm_hook})()
    assert client.watch_ddp(not_ddp) is False
    assert "needs a DistributedDataParallel model, got FullyShardedDataParallel" in capsys.readouterr().err


def test_waiting_counts_the_block_as_wait(slot_dir: Path) -> None:
    client.step(0)
    with client.waiting():
        time.sleep(0.02)
    client.step(1)
    rec = S.read_slot(S.slot_path(slot_dir, 0))
    assert rec is not None
    (own,) = rec.recent_own_ns
    assert own <= rec.recent_iter_ns[-1] - 20_000_000


@pytest.mark.torch
def test_a_real_ddp_model_accepts_the_hook_and_its_gradients_are_unchanged(slot_dir: Path,
                                                                           tmp_path: Path) -> None:  # fmt: skip
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = torch.nn.Linear(4, 1)
        watched = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 1))
        watched.module.load_state_dict(plain.state_dict())
        assert client.watch_ddp(watched) is True
        x = torch.randn(8, 4)
        client.step(0)
        for i in range(1, 4):
            for m in (plain, watched):
                m.zero_grad()
                m(x).pow(2).mean().backward()
            client.step(i)
        assert torch.allclose(plain.weight.grad, watched.module.weight.grad)
        rec = S.read_slot(S.slot_path(slot_dir, 0))
        assert rec is not None and len(rec.recent_own_ns) == 3 and rec.own_ewma_ns > 0
        assert all(own <= it for own, it in zip(rec.recent_own_ns, rec.recent_iter_ns, strict=True))
    finally:
        dist.destroy_process_group()


class HostClock:
    def __init__(self, c: Clock) -> None:
        self.c = c

    def begin(self) -> int:
        return self.c.now

    def end(self, t0: int) -> None:
        api._add_wait(self.c.now - t0)


def test_a_counted_collective_is_counted_once_even_when_it_waits_on_its_own_work(waits: list[int]) -> None:
    c = Clock()
    depth = collectives.threading.local()
    clock = HostClock(c)

    def wait() -> None:
        c.now += 300

    counted_wait = collectives._counted(wait, clock, depth)

    def all_reduce(t: Any, async_op: bool = False, group: Any = None) -> str:
        c.now += 1000
        counted_wait()  # a blocking collective waits on its own Work inside
        return "work"

    counted = collectives._counted(all_reduce, clock, depth)
    assert counted("t") == "work" and waits == [1300]
    counted_wait()
    assert waits == [1300, 300] and counted.__wrapped__ is all_reduce and counted.__name__ == "all_reduce"
    saver_group = object()
    collectives.ignore_group(saver_group)
    try:
        counted("t", group=saver_group)  # a background checkpoint save's collective: overlaps the step
        assert waits == [1300, 300]
        counted("t", group=object())  # another group's: a wait like any
        assert waits == [1300, 300, 1300]
    finally:
        collectives._IGNORED_GROUPS.clear()


def test_a_failing_collective_raises_its_own_error_and_a_broken_clock_never_fails_it(waits: list[int]) -> None:
    depth = collectives.threading.local()

    def lost(*args: Any) -> None:
        raise RuntimeError("Connection closed by peer")

    with pytest.raises(RuntimeError, match="closed by peer"):
        collectives._counted(lost, HostClock(Clock()), depth)()
    assert waits == [0] and not depth.n  # counted, and the next call is counted again

    class Broken:
        def begin(self) -> int:
            raise OSError("clock")

        def end(self, t0: int) -> None:
            raise OSError("clock")

    assert collectives._counted(lambda: 7, Broken(), depth)() == 7


class FakeEvent:
    """A CUDA timing event: recorded at the fake GPU's time, passed once the GPU's clock reaches it."""

    gpu = [0.0]  # ms the fake GPU has executed up to
    log: list[FakeEvent] = []

    def __init__(self, enable_timing: bool = False) -> None:
        assert enable_timing
        self.at = 0.0

    def record(self) -> None:
        self.at = FakeEvent.gpu[0] + 5.0 * len(FakeEvent.log)  # the stream is behind the host
        FakeEvent.log.append(self)

    def query(self) -> bool:
        return FakeEvent.gpu[0] >= self.at

    def elapsed_time(self, other: FakeEvent) -> float:
        return other.at - self.at


def test_gpu_waits_are_read_when_the_stream_has_passed_them_without_a_sync(waits: list[int]) -> None:
    FakeEvent.gpu, FakeEvent.log = [0.0], []
    clock = collectives._StreamWaits(type("cuda", (), {"Event": FakeEvent}))
    start = clock.begin()
    clock.end(start)  # recorded at 0 ms and 5 ms of GPU time: the GPU is not there yet
    assert waits == [] and len(clock.pending) == 1
    FakeEvent.gpu[0] = 6.0
    clock.end(clock.begin())  # the next collective's end reads the first pair (no synchronize)
    assert waits == [5_000_000] and len(clock.pending) == 1
    clock.pending.extend([clock.pending[0]] * collectives._MAX_PENDING_EVENTS)
    assert clock.begin() is None  # a GPU this far behind: untimed until it catches up


def test_unsupervised_watch_collectives_changes_nothing(env: pytest.MonkeyPatch) -> None:
    assert client.watch_collectives() is False and collectives._watched == []


@pytest.mark.torch
def test_watch_collectives_times_real_gloo_collectives_and_puts_them_back(slot_dir: Path, tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    torch = pytest.importorskip("torch")
    dist = torch.distributed
    original = dist.all_reduce, dist.distributed_c10d.Work.wait
    assert client.watch_collectives() is False  # before init_process_group: a warning, nothing changed
    assert "needs an initialized process group" in capsys.readouterr().err and dist.all_reduce is original[0]
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert client.watch_collectives() is True and client.watch_collectives() is True  # twice: wrapped once
        assert dist.all_reduce.__wrapped__ is original[0]
        t = torch.ones(4)
        client.step(0)
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.barrier()
        client.step(1)
        rec = S.read_slot(S.slot_path(slot_dir, 0))
        assert rec is not None and rec.rank_flags & S.RANK_FLAG_WAITS
        (own,) = rec.recent_own_ns
        assert own < rec.recent_iter_ns[-1] and torch.equal(t, torch.ones(4))  # world of one: the sum is itself
    finally:
        client.unwatch_collectives()
        dist.destroy_process_group()
    assert (dist.all_reduce, dist.distributed_c10d.Work.wait) == original

"""The node agent's view of its memory store (supervisor/agent/memory_inventory.py): shards written by ranks
(MemorySnapshots) are offered only once their bytes match their record; a flipped bit, a torn file or a missing
record never counts; each file is hashed once; and two nodes' inventories feed the restore pick."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.agent import memory_inventory
from supervisor.agent.memory_inventory import Inventory
from supervisor.decisions.memory_pick import Held, pick

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from supervisor.checkpoint.memory import MemorySnapshots  # noqa: E402


def write(root: Path, rank: int, world: int, step: int) -> None:
    mem = MemorySnapshots(root, keep=3)
    mem.rank, mem.world = rank, world
    mem.save({"w": torch.full((64,), float(step + rank)), "step": step}, step)
    mem.close()


def test_verified_shards_are_offered_and_damaged_ones_are_not(tmp_path: Path) -> None:
    for step in (10, 20):
        write(tmp_path, 0, 2, step)
    write(tmp_path, 1, 2, 20)
    inv = Inventory(tmp_path)
    got = sorted(inv.scan(), key=lambda h: (h.step, h.rank))
    assert [(h.step, h.rank, h.world, h.verified) for h in got] == [(10, 0, 2, True), (20, 0, 2, True), (20, 1, 2, True)]
    shard = tmp_path / "step_20" / "rank_1.snap"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))  # a new mtime: hashed again
    flipped = [h for h in inv.scan() if (h.step, h.rank) == (20, 1)]
    assert [h.verified for h in flipped] == [False]
    shard.write_bytes(bytes(data[:-5]))  # torn: its header promises more
    assert not [h for h in inv.scan() if (h.step, h.rank) == (20, 1)]
    (tmp_path / "step_10" / "rank_0.json").unlink()  # no record: the shard does not exist
    assert {(h.step, h.rank) for h in inv.scan()} == {(20, 0)}
    assert Inventory(tmp_path / "missing").scan() == []


def test_each_file_is_hashed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, 0, 1, 5)
    calls = []
    real = memory_inventory.verify
    monkeypatch.setattr(memory_inventory, "verify", lambda *a: calls.append(a) or real(*a))
    inv = Inventory(tmp_path)
    assert inv.scan() == inv.scan() and len(calls) == 1


def test_two_nodes_inventories_pick_the_newest_step_complete_across_them(tmp_path: Path) -> None:
    n1, n2 = tmp_path / "n1", tmp_path / "n2"
    for step in (10, 20):
        write(n1, 0, 2, step)
        write(n2, 1, 2, step)  # rank 1's own node
    write(n1, 1, 2, 10)  # n1 also holds rank 1's step 10 (its buddy copy)
    held: dict[str, list[Held]] = {"n1": Inventory(n1).scan(), "n2": Inventory(n2).scan()}
    both, _ = pick(held, world=2, usable=["n1", "n2"], placement={0: "n1", 1: "n2"}, newest_filesystem_step=0)
    assert both is not None and both.step == 20 and both.fetches == 0
    lost, why = pick(held, world=2, usable=["n1"], placement={0: "n1", 1: "n1"}, newest_filesystem_step=0)
    assert lost is not None and lost.step == 10 and lost.sources == {0: "n1", 1: "n1"}, why  # n2 gone: its buddy copy


def test_the_agents_thread_reports_changes_and_answers_a_request_at_once(tmp_path: Path) -> None:
    """The store is made 0700; a new shard is reported within a scan; an unchanged store is reported again when
    the supervisor asks (before a relaunch), long before the periodic resend."""
    import time

    from supervisor.agent.memory_thread import MemoryThread, make_store
    from supervisor.heartbeat import wire
    from supervisor.heartbeat.memory_report import parse_memory

    store = make_store(tmp_path / "slot" / "memory")
    assert store.stat().st_mode & 0o777 == 0o700
    thread = MemoryThread(store, scan_s=0.05, resend_s=3600)
    thread.start()
    try:
        def next_event(timeout: float = 5.0) -> wire.Event | None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                got = thread.events()
                if got:
                    return got[-1]
                time.sleep(0.01)
            return None

        first = next_event()
        assert first is not None and first.kind == wire.EVENT_MEMORY and parse_memory(first.text) == ()
        write(store, 0, 1, 7)
        got = next_event()
        assert got is not None and [(h.step, h.verified) for h in parse_memory(got.text)] == [(7, True)]
        assert next_event(0.3) is None  # unchanged: nothing until asked
        thread.request()
        asked = next_event(1.0)
        assert asked is not None and [h.step for h in parse_memory(asked.text)] == [7]
    finally:
        thread.close()
    link = tmp_path / "planted"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        make_store(link)

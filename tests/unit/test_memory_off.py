"""Not enough node memory for the memory tier (issue 27, bad input): a rank finds its node's store too small
before its first snapshot, or a write fails on a full store (a real, small tmpfs: real ENOSPC); it turns its
snapshots off and leaves a marker, its agent reports it, the supervisor journals one ``memory_off`` line naming
the node, rank and cause, and turns the tier off for the campaign (this run's next launches and, from the
journal, the requeued runs); the filesystem tier is untouched."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.agent.memory_thread import MemoryThread
from supervisor.checkpoint.memory_room import mark_off, read_off, room_needed
from supervisor.decisions import events as ev
from supervisor.decisions.campaign_state import fold
from supervisor.decisions.memory_off import memory_off
from supervisor.driver.context import Context
from supervisor.driver.memory_off import MemoryOff
from supervisor.heartbeat import wire
from supervisor.heartbeat.memory_report import encode_memory, parse_memory_report
from supervisor.heartbeat.table import LiveTable


@pytest.fixture
def small_tmpfs(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A 4 MiB tmpfs, as a node whose /dev/shm is small; skipped where this user may not mount one."""
    where = tmp_path / "shm"
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(where)],
                          capture_output=True, check=False)  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _state(kib: int) -> dict[str, Any]:
    torch = pytest.importorskip("torch")
    return {"w": torch.arange(kib * 256, dtype=torch.float32), "step": 1}


@pytest.mark.torch
def test_a_store_too_small_for_the_tier_is_never_filled_and_the_rank_says_why(small_tmpfs: Path) -> None:
    from supervisor.checkpoint.memory import MemorySnapshots

    mem = MemorySnapshots(small_tmpfs, keep=2, every=1)
    try:
        assert mem.snapshot(_state(1024), 1) is True  # due, but 1 MiB x 9 copies (with the ring) do not fit in 4 MiB
        mem.wait()
        assert not mem.enabled and "MiB free" in mem.off_reason
        assert not list(small_tmpfs.glob("step_*")), "nothing written into a store that is too small"
        assert read_off(small_tmpfs) == ((0, errno.ENOSPC),)
        assert mem.save(_state(1024), 2) is None  # off for the rest of the run: the training goes on
    finally:
        mem.close()


@pytest.mark.torch
def test_a_write_that_fails_on_a_full_store_turns_snapshots_off_and_keeps_no_half_shard(small_tmpfs: Path) -> None:
    from supervisor.checkpoint.memory import MemorySnapshots

    mem = MemorySnapshots(small_tmpfs, keep=2, every=1)
    try:
        mem.snapshot(_state(256), 1)  # 256 KiB x 9 copies fit: the check passes, the first shard is written
        assert mem.wait() is not None and mem.enabled
        balloon = small_tmpfs / "balloon"  # something else fills /dev/shm meanwhile
        with open(balloon, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
            except OSError:
                pass
        mem.snapshot(_state(256), 2)
        mem.wait()
        assert not mem.enabled and "No space left" in mem.off_reason
        assert not list(small_tmpfs.glob("step_2/*.tmp")) and not (small_tmpfs / "step_2" / "rank_0.snap").exists()
        assert read_off(small_tmpfs) == ((0, errno.ENOSPC),)
    finally:
        mem.close()


def test_room_needed_counts_every_rank_of_the_node_its_kept_copies_the_ring_and_the_buddys() -> None:
    assert room_needed(100, keep=2, ranks_on_node=1) == int(100 * 5 * 1.1)
    assert room_needed(100, keep=2, ranks_on_node=1, ring=2) == int(100 * 9 * 1.1)  # two per ring distance
    assert room_needed(100, keep=2, ranks_on_node=8) == 8 * room_needed(100, keep=2, ranks_on_node=1)
    assert room_needed(0, keep=2, ranks_on_node=4) == 0


def test_the_agent_reports_the_failed_ranks_and_the_table_keeps_them(tmp_path: Path) -> None:
    mark_off(tmp_path, 3, errno.ENOSPC)
    mark_off(tmp_path, 1, errno.EIO)
    (tmp_path / ".off-rank_x-errno_1").touch()  # not a marker: ignored
    thread = MemoryThread(tmp_path, scan_s=0.05)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not (got := thread.events()) and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        thread.close()
    assert parse_memory_report(got[0].text).off == ((1, errno.EIO), (3, errno.ENOSPC))
    key = wire.derive_key(b"s" * 32, b"c")
    table = LiveTable(key, "7", wall_ns=lambda: 1_000 * 10**9)
    assert table.feed(wire.encode_events(key, instance=1, seq=1, wall_ns=1_000 * 10**9, mono_ns=1, job="7", node="n4",
                                         events=[wire.Event(wire.EVENT_MEMORY, 0, got[0].text)]))  # fmt: skip
    assert table.memory_off == {"n4": ((1, errno.EIO), (3, errno.ENOSPC))}


def test_one_failed_rank_is_one_clear_line_naming_node_rank_and_cause() -> None:
    assert memory_off({}) == "" and memory_off({"n1": ()}) == ""
    why = memory_off({"n2": [(1, errno.ENOSPC)], "n3": [(2, errno.ENOSPC)]})
    assert "rank 1 on n2 and 1 more rank(s)" in why and os.strerror(errno.ENOSPC) in why and "/dev/shm" in why
    assert "filesystem checkpoints go on" in why


class _Channel:
    def __init__(self) -> None:
        self.table = type("T", (), {"memory_off": {}})()


def test_the_supervisor_journals_it_once_and_turns_the_tier_off_for_this_run_and_the_requeued_ones() -> None:
    events: list[dict[str, Any]] = []
    channel, turned = _Channel(), []
    watch = MemoryOff(Context.of(events.append, clock=lambda: 50.0), channel, lambda: turned.append(1), enabled=True)
    watch.observe()
    assert events == [] and turned == []
    channel.table.memory_off["n2"] = ((1, errno.ENOSPC),)
    watch.observe()
    watch.observe()
    assert turned == [1] and [e["type"] for e in events] == [ev.MEMORY_OFF]
    assert events[0]["failed"] == {"n2": [1]} and "rank 1 on n2" in events[0]["why"]
    assert fold(events).memory_off == events[0]["why"], "a requeued run starts with the tier off"
    assert fold([]).memory_off == ""
    quiet: list[dict[str, Any]] = []
    MemoryOff(Context.of(quiet.append, clock=lambda: 1.0), channel, lambda: turned.append(2), enabled=False).observe()
    assert quiet == [] and turned == [1]


def test_encode_keeps_the_off_list_bounded() -> None:
    text = encode_memory([], "", [(r, errno.ENOSPC) for r in range(500)])
    assert len(parse_memory_report(text).off) == 64


def test_the_campaign_relaunches_and_requeues_without_the_tier_once_a_store_failed(tmp_path: Path) -> None:
    """The real supervision loop with the in-process fakes: launch 1 has the tier, a node reports a failed
    rank, the relaunch's ranks get no memory store; a requeued run of the campaign starts without it."""
    from fakes import Launch
    from test_driver import TRACEBACK, make, run

    from supervisor.checkpoint.memory import MEMORY_DIR_ENV

    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(1, log=TRACEBACK), Launch(0, ranks={"state": "exited",
                                                                                             "exit_code": 0})])
    channel.table.memory_off["n2"] = ((1, errno.ENOSPC),)
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0
    trains = [env for argv, env in zip(launcher.argvs, launcher.envs, strict=True) if "train.py" in argv]
    assert MEMORY_DIR_ENV in trains[0] and MEMORY_DIR_ENV not in trains[1], "off from the next launch on"
    assert [e["failed"] for e in r.of(ev.MEMORY_OFF)] == [{"n2": [1]}]
    again, slurm2, launcher2, channel2, _ = make(tmp_path, [Launch(0, ranks={"state": "exited", "exit_code": 0})])
    assert run(again, slurm2, launcher2, channel2).code == 0
    assert all(MEMORY_DIR_ENV not in env for env in launcher2.envs), "the requeued run starts with the tier off"

"""The memory tier's rank side (supervisor/checkpoint/memory.py, snapshot_format.py): a rank's state written to
node-local memory and read back bitwise (nested dicts, integer keys, lists, plain values, bfloat16, a DTensor's
local shard), a torn or altered shard refused with a clear error, retention of the newest steps, and a header
parser that raises only its own error whatever the bytes."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.checkpoint.memory import MemorySnapshotError, MemorySnapshots
from supervisor.checkpoint.snapshot_format import MAGIC, SnapshotFormatError, parse_header

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch


def state(seed: int) -> dict:
    gen = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(5, 3, generator=gen), "b": torch.randn(3, generator=gen).to(torch.bfloat16)},
        "optim": {"state": {0: {"step": torch.tensor(float(seed)), "exp_avg": torch.randn(4, generator=gen)}},
                  "param_groups": [{"lr": 0.1 * seed, "params": [0, 1], "name": None, "nesterov": False,
                                   "betas": (0.9, 0.9 + 0.01 * seed)}]},
        "train": {"step": torch.tensor(seed), "empty": torch.empty(0)},
    }


def same(a: object, b: object) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert type(a) is type(b)
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def test_a_snapshot_reads_back_bitwise_into_the_programs_state(tmp_path: Path) -> None:
    mem = MemorySnapshots(tmp_path, keep=2)
    saved = state(3)
    mem.save(saved, 30)
    saved["model"]["w"].add_(1.0)  # the training goes on: the snapshot holds the values at save time
    assert mem.wait() == tmp_path / "step_30" / "rank_0.snap"
    target = state(4)
    mem.load(30, target)
    assert same(target, {**state(3)})
    record = json.loads((tmp_path / "step_30" / "rank_0.json").read_text())
    assert record["step"] == 30 and record["world"] == 1 and len(record["sha256"]) == 64
    assert stat.S_IMODE((tmp_path / "step_30").stat().st_mode) == 0o700
    mem.close()


def test_only_the_newest_steps_are_kept(tmp_path: Path) -> None:
    mem = MemorySnapshots(tmp_path, keep=2, ring=())
    for step in (10, 20, 30, 40):
        mem.save(state(step), step)
    mem.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_30", "step_40"]


def test_the_roll_back_ring_keeps_older_snapshots_and_a_later_timeline_goes(tmp_path: Path) -> None:
    mem = MemorySnapshots(tmp_path, keep=2, ring=(20,))
    for step in range(5, 75, 5):
        mem.save(state(1), step)
    mem.wait()
    assert sorted(int(p.name[5:]) for p in tmp_path.iterdir()) == [40, 60, 65, 70]  # 40: 30 steps back
    mem.save(state(1), 45)  # rolled back to 40: 60..70 are the abandoned timeline's
    mem.close()
    assert sorted(int(p.name[5:]) for p in tmp_path.iterdir()) == [40, 45]


@pytest.mark.parametrize("damage", ["truncate", "flip", "sidecar", "missing"])
def test_a_torn_or_altered_shard_is_refused_with_the_fix(tmp_path: Path, damage: str) -> None:
    mem = MemorySnapshots(tmp_path)
    mem.save(state(1), 5)
    mem.close()
    shard, sidecar = tmp_path / "step_5" / "rank_0.snap", tmp_path / "step_5" / "rank_0.json"
    data = bytearray(shard.read_bytes())
    if damage == "truncate":
        shard.write_bytes(bytes(data[:-7]))
    elif damage == "flip":
        data[len(data) // 2] ^= 0x10
        shard.write_bytes(bytes(data))
    elif damage == "sidecar":
        sidecar.write_text("{not json")
    else:
        sidecar.unlink()
    with pytest.raises(MemorySnapshotError) as err:
        MemorySnapshots(tmp_path).load(5, state(2))
    assert "filesystem checkpoint" in err.value.fix


def test_a_snapshot_of_another_shape_or_world_is_refused(tmp_path: Path) -> None:
    mem = MemorySnapshots(tmp_path)
    mem.save(state(1), 5)
    mem.close()
    wrong = state(1)
    wrong["model"]["w"] = torch.zeros(6, 3)
    with pytest.raises(MemorySnapshotError, match=r"model/w is \(6, 3\)"):
        MemorySnapshots(tmp_path).load(5, wrong)
    other = MemorySnapshots(tmp_path)
    other.world = 2
    with pytest.raises(MemorySnapshotError, match="rank 0 of 1; wanted step 5, rank 0 of 2"):
        other.load(5, state(1))


def test_without_a_memory_directory_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUPERVISOR_MEMORY_DIR", raising=False)
    mem = MemorySnapshots()
    assert not mem.enabled and mem.save(state(1), 1) is None
    monkeypatch.setenv("SUPERVISOR_MEMORY_DIR", str(tmp_path))
    assert MemorySnapshots().enabled


def test_a_relaunch_restores_the_picked_step_and_a_refused_shard_touches_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """The supervisor names the step (SUPERVISOR_RESUME_MEMORY_STEP); a shard that is not this state's (here a
    shape differs at the last leaf) is refused before any tensor of the program's state is written, so the
    filesystem tier starts from the untouched state."""
    monkeypatch.setenv("SUPERVISOR_LAUNCH", "7-0-1")
    mem = MemorySnapshots(tmp_path)
    mem.save(state(1), 5)
    mem.close()
    assert json.loads((tmp_path / "step_5" / "rank_0.json").read_text())["launch"] == "7-0-1"
    monkeypatch.delenv("SUPERVISOR_RESUME_MEMORY_STEP", raising=False)
    target = state(2)
    assert MemorySnapshots(tmp_path).restore(target) is None and same(target, state(2))  # nothing picked
    monkeypatch.setenv("SUPERVISOR_RESUME_MEMORY_STEP", "5")
    assert MemorySnapshots(tmp_path).restore(target) == 5 and same(target, state(1))
    wrong = state(2)
    wrong["train"]["empty"] = torch.zeros(2)
    assert MemorySnapshots(tmp_path).restore(wrong) is None
    untouched = state(2)
    untouched["train"]["empty"] = torch.zeros(2)
    assert same(wrong, untouched)


def test_snapshots_follow_the_cadence_and_auto_measures_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    every3 = MemorySnapshots(tmp_path / "a", every=3, keep=10)
    taken = [step for step in range(1, 10) if every3.snapshot(lambda: state(1), step)]
    every3.close()
    assert taken == [3, 6, 9]
    monkeypatch.setenv("SUPERVISOR_MEMORY_EVERY", "auto")
    auto = MemorySnapshots(tmp_path / "b", keep=10)
    assert auto.snapshot(state(1), 1) and auto.every is None  # the first one measures the copy
    assert auto.snapshot(state(1), 2)  # the second one too: it reuses the buffers, the cost planned with
    auto.due(3)  # at the next step the ranks agree on the measured interval
    assert auto.every is not None and auto.every >= 1  # then the cadence is fixed
    auto.close()


def test_a_full_store_turns_snapshots_off_and_the_training_goes_on(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    mem = MemorySnapshots(blocked / "memory")
    mem.save(state(1), 1)
    assert mem.wait() is None and not mem.enabled and mem.save(state(1), 2) is None
    assert not mem.snapshot(state(1), 3)
    assert capsys.readouterr().err.count("memory snapshots off for this run") == 1
    mem.close()


def test_a_dtensor_local_shard_round_trips_into_the_fsdp2_model(tmp_path: Path) -> None:
    dist = torch.distributed
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        def build(seed: int):  # type: ignore[no-untyped-def]
            torch.manual_seed(seed)
            net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
            for layer in net:
                fully_shard(layer, mesh=init_device_mesh("cpu", (1,)))
            opt = torch.optim.AdamW(net.parameters(), lr=0.01)
            net(torch.randn(2, 4)).sum().backward()
            opt.step()
            return net, opt

        net, opt = build(1)
        model_sd, optim_sd = get_state_dict(net, opt)
        mem = MemorySnapshots(tmp_path / "mem")
        mem.save({"model": model_sd, "optim": optim_sd}, 7)
        mem.close()
        other, other_opt = build(2)
        model2, optim2 = get_state_dict(other, other_opt)
        restored = {"model": model2, "optim": optim2}
        MemorySnapshots(tmp_path / "mem").load(7, restored)
        set_state_dict(other, other_opt, model_state_dict=restored["model"], optim_state_dict=restored["optim"])
        for a, b in zip(net.parameters(), other.parameters(), strict=True):
            assert torch.equal(a.full_tensor(), b.full_tensor())
    finally:
        dist.destroy_process_group()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300) | st.builds(lambda b: MAGIC + len(b).to_bytes(8, "little") + b, st.binary(max_size=200))
       | st.builds(lambda d: MAGIC + len(d).to_bytes(8, "little") + d,
                   st.recursive(st.none() | st.integers() | st.text(max_size=5), lambda c: st.lists(c, max_size=4)
                                | st.dictionaries(st.sampled_from(["step", "rank", "world", "leaves", "payload_bytes",
                                                                   "path", "dtype", "shape", "offset", "nbytes", "value"]),
                                                  c, max_size=6), max_leaves=20).map(lambda v: json.dumps(v).encode())))
def test_the_header_parser_raises_only_its_own_error(data: bytes) -> None:
    try:
        parse_header(data)
    except SnapshotFormatError:
        pass


def test_a_rank_moved_to_its_buddys_node_restores_the_copy_of_the_picked_launch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """On a spare that was the lost node's buddy, the rank's shard is the node's copy (``replica/<node>/``); a
    shard of the same step in the node's own store written by another launch is not the one picked."""
    monkeypatch.setenv("SUPERVISOR_LAUNCH", "j-0-1")
    writer = MemorySnapshots(tmp_path / "replica" / "lost")
    writer.save(state(1), 5)
    writer.close()
    monkeypatch.setenv("SUPERVISOR_LAUNCH", "j-0-2")
    other = MemorySnapshots(tmp_path)
    other.save(state(9), 5)
    other.close()
    monkeypatch.setenv("SUPERVISOR_RESUME_MEMORY_STEP", "5")
    monkeypatch.setenv("SUPERVISOR_RESUME_MEMORY_LAUNCH", "j-0-1")
    target = state(2)
    assert MemorySnapshots(tmp_path).restore(target) == 5 and same(target, state(1))
    monkeypatch.setenv("SUPERVISOR_RESUME_MEMORY_LAUNCH", "j-0-2")
    assert MemorySnapshots(tmp_path).restore(target) == 5 and same(target, state(9))


def test_a_requeued_rank_restores_the_snapshot_flushed_to_the_filesystem(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A requeued job's node memory is empty: the rank reads its shard from the copy flushed before the previous
    job stopped (``SUPERVISOR_RESUME_MEMORY_FLUSHED``, what ``agent.flush_copy`` leaves); a flipped byte there is
    refused like a torn shard in memory."""
    monkeypatch.setenv("SUPERVISOR_LAUNCH", "j-0-3")
    writer = MemorySnapshots(tmp_path / "old-node")
    writer.save(state(4), 7)
    writer.close()
    flushed_dir = tmp_path / "campaign" / "memory-flush" / "step_7"
    flushed_dir.parent.mkdir(parents=True)
    (tmp_path / "old-node" / "step_7").rename(flushed_dir)
    monkeypatch.setenv("SUPERVISOR_RESUME_MEMORY_STEP", "7")
    monkeypatch.setenv("SUPERVISOR_RESUME_MEMORY_LAUNCH", "j-0-3")
    monkeypatch.setenv("SUPERVISOR_RESUME_MEMORY_FLUSHED", str(flushed_dir))
    target = state(2)
    assert MemorySnapshots(tmp_path / "new-node").restore(target) == 7 and same(target, state(4))
    shard = flushed_dir / "rank_0.snap"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    target = state(2)
    assert MemorySnapshots(tmp_path / "new-node").restore(target) is None and same(target, state(2))


def test_a_store_its_agent_removed_is_not_made_again_and_snapshots_resume_when_it_is_back(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    """At the end of a job the node agent removes the store while ranks may still train: a rank that made it
    again would leave its snapshots in the node's memory after the job, with nobody to remove them (and a stale
    "store failed" marker). It writes nothing instead, without turning snapshots off: an agent restarted in the
    same job makes the store anew, and the snapshots go on there."""
    import shutil

    root = tmp_path / "memory"
    mem = MemorySnapshots(root, keep=2)
    mem.save(state(1), 1)
    assert mem.wait() == root / "step_1" / "rank_0.snap"
    shutil.rmtree(root)
    assert mem.save(state(2), 2) is None and mem.wait() is None
    assert not root.exists() and mem.enabled
    root.mkdir(mode=0o700)  # a restarted agent's store
    mem.save(state(3), 3)
    assert mem.wait() == root / "step_3" / "rank_0.snap"
    assert "snapshots off" not in capsys.readouterr().err
    mem.close()


def test_a_store_removed_during_the_write_is_not_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    root = tmp_path / "memory"
    mem = MemorySnapshots(root, keep=2)
    real = mem._write_file

    def removed_meanwhile(*args: object) -> None:
        shutil.rmtree(root)
        real(*args)  # type: ignore[arg-type]

    mem._write_file = removed_meanwhile  # type: ignore[method-assign]
    mem.save(state(1), 1)
    assert mem.wait() is None and mem.enabled and not root.exists()
    assert "snapshots off" not in capsys.readouterr().err
    mem.close()

"""The checkpoint store on real directories: statuses, fallback, quarantine, adoption, retention, CLI.

Checkpoints are built here without torch (shard bytes + a manifest written by the real writer code),
which is exactly what the supervisor sees: it must never need torch to judge a checkpoint.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.checkpoint import hashing
from supervisor.checkpoint.durable import write_durable
from supervisor.checkpoint.hashing import DEFAULT_ALGORITHM, hash_file
from supervisor.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest
from supervisor.checkpoint.store import REASON_FILE, CheckpointStore, checkpoint_name
from supervisor.cli import main as cli_main


def make_checkpoint(root: Path, step: int, shards: int = 2, size: int = 4096, when: float | None = None,
                    algorithm: str = DEFAULT_ALGORITHM) -> Path:
    d = root / checkpoint_name(step)
    d.mkdir(parents=True)
    entries = []
    for name in [".metadata"] + [f"__{r}_0.distcp" for r in range(shards)]:
        (d / name).write_bytes(os.urandom(size))
        n, digest = hash_file(d / name, algorithm)
        entries.append(FileEntry(name, n, digest))
    m = Manifest(step=step, time=when if when is not None else time.time(), world_size=shards,
                 hash_algorithm=algorithm, files=tuple(entries))
    write_durable(d / MANIFEST_NAME, m.to_json())
    return d


def flip_byte(path: Path, offset: int = 100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def edit_manifest(ckpt: Path, edit) -> None:
    doc = json.loads((ckpt / MANIFEST_NAME).read_bytes())
    edit(doc)
    (ckpt / MANIFEST_NAME).write_text(json.dumps(doc))


def test_newest_valid_is_the_highest_step(tmp_path: Path) -> None:
    for step in (10, 30, 20):
        make_checkpoint(tmp_path, step)
    store = CheckpointStore(tmp_path)
    assert [i.step for i in store.list()] == [30, 20, 10]
    assert all(i.status == "valid" for i in store.list())
    best = store.newest_valid(full=True)
    assert best is not None and best.step == 30 and best.verified_hashes


def test_flipped_byte_passes_quick_check_fails_full_then_falls_back_and_quarantines(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    bad = make_checkpoint(tmp_path, 20)
    flip_byte(bad / "__1_0.distcp")
    store = CheckpointStore(tmp_path)
    assert store.validate(bad).status == "valid"  # same size: only the hash can tell
    full = store.validate(bad, full=True)
    assert full.status == "invalid" and "__1_0.distcp" in full.reason and "mismatch" in full.reason
    best = store.newest_valid(full=True)
    assert best is not None and best.step == 10
    assert not bad.exists()
    [q] = store.quarantined()
    assert q.path.name.startswith(bad.name) and "mismatch" in q.reason
    assert (q.path / "__1_0.distcp").exists(), "quarantine must move, never delete"
    assert (q.path / REASON_FILE).read_text().startswith(full.reason)


@pytest.mark.parametrize("damage, words", [
    (lambda d: (d / MANIFEST_NAME).write_bytes((d / MANIFEST_NAME).read_bytes()[:57]), "not valid JSON"),
    (lambda d: (d / MANIFEST_NAME).unlink(), "no manifest.json"),
    (lambda d: (d / "__0_0.distcp").unlink(), "'__0_0.distcp' is missing"),
    (lambda d: os.truncate(d / "__1_0.distcp", 100), "has 100 bytes, manifest says 4096"),
    (lambda d: edit_manifest(d, lambda m: m["files"][0].update(path="../step_000000010/.metadata")), "'..'"),
    (lambda d: edit_manifest(d, lambda m: m["files"][0].update(path="/etc/hostname")), "absolute"),
])
def test_damaged_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path: Path, damage, words: str) -> None:
    make_checkpoint(tmp_path, 10)
    bad = make_checkpoint(tmp_path, 20)
    damage(bad)
    store = CheckpointStore(tmp_path)
    v = store.validate(bad)
    assert v.status == "invalid" and words in v.reason, v.reason
    best = store.newest_valid()
    assert best is not None and best.step == 10
    assert [q.reason for q in store.quarantined()] == [v.reason]


def test_full_check_without_the_hash_library_checks_sizes_and_says_so(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("crc32c")
    ck = make_checkpoint(tmp_path, 5, algorithm="crc32c")
    monkeypatch.setattr(hashing, "_crc32c", None)
    v = CheckpointStore(tmp_path).validate(ck, full=True)
    assert v.status == "valid" and not v.full and "crc32c is not available" in v.reason
    assert CheckpointStore(tmp_path).newest_valid(full=True) is not None  # never quarantined for that


def test_symlink_escaping_the_checkpoint_is_rejected(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    ck = make_checkpoint(tmp_path / "root", 5)
    outside.write_bytes((ck / "__0_0.distcp").read_bytes())  # identical bytes: only confinement can catch it
    (ck / "__0_0.distcp").unlink()
    (ck / "__0_0.distcp").symlink_to(outside)
    v = CheckpointStore(tmp_path / "root").validate(ck, full=True)
    assert v.status == "invalid" and "outside the checkpoint directory" in v.reason


def test_symlink_inside_the_checkpoint_is_fine(tmp_path: Path) -> None:
    ck = make_checkpoint(tmp_path, 5)
    (ck / "data").mkdir()
    (ck / "__0_0.distcp").rename(ck / "data" / "real.bin")
    (ck / "__0_0.distcp").symlink_to("data/real.bin")
    assert CheckpointStore(tmp_path).validate(ck, full=True).status == "valid"


def test_incomplete_temp_dirs_are_reported_never_chosen_never_moved(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    tmp = tmp_path / ".incomplete-step_000000020-abcd1234"
    tmp.mkdir()
    (tmp / "__0_0.distcp").write_bytes(b"partial")
    store = CheckpointStore(tmp_path)
    statuses = {i.path.name: (i.status, i.step) for i in store.list()}
    assert statuses[tmp.name] == ("incomplete", 20)
    best = store.newest_valid()
    assert best is not None and best.step == 10
    assert tmp.exists() and store.quarantined() == []


def test_no_checkpoint_at_all(tmp_path: Path) -> None:
    (tmp_path / "logs").mkdir()  # unrelated directories are not checkpoints
    assert CheckpointStore(tmp_path).list() == []
    assert CheckpointStore(tmp_path).newest_valid() is None


def _dcp_dir(root: Path, name: str, refs: list[str], create: list[str]) -> Path:
    d = root / name
    d.mkdir(parents=True)
    # Shaped like DCP's metadata pickle: the shard names appear as string constants.
    (d / ".metadata").write_bytes(pickle.dumps({"storage_data": {i: {"relative_path": r} for i, r in enumerate(refs)}}))
    for f in create:
        (d / f).write_bytes(b"x" * 10)
    return d


def test_adopted_dcp_directory_is_unverified_but_usable(tmp_path: Path) -> None:
    _dcp_dir(tmp_path, "checkpoint-700", ["__0_0.distcp", "__1_0.distcp"], ["__0_0.distcp", "__1_0.distcp"])
    [info] = CheckpointStore(tmp_path).list()
    assert info.status == "unverified" and info.step == 700 and "structural checks only" in info.reason
    assert CheckpointStore(tmp_path).newest_valid() == info
    assert CheckpointStore(tmp_path).newest_valid(allow_unverified=False) is None


def test_adopted_dcp_directory_with_missing_shard_is_invalid(tmp_path: Path) -> None:
    d = _dcp_dir(tmp_path, "checkpoint-700", ["__0_0.distcp", "__1_0.distcp"], ["__0_0.distcp"])
    v = CheckpointStore(tmp_path).validate(d)
    assert v.status == "invalid" and "'__1_0.distcp' is missing" in v.reason


def test_empty_dcp_metadata_is_invalid(tmp_path: Path) -> None:
    d = _dcp_dir(tmp_path, "iter_5", [], ["__0_0.distcp"])
    (d / ".metadata").write_bytes(b"")
    assert CheckpointStore(tmp_path).validate(d).reason == "no manifest.json; DCP .metadata is empty"


class _Boom:
    def __reduce__(self):
        return (os.mkdir, ("/tmp/PWNED-by-checkpoint-metadata",))


def test_a_hostile_metadata_pickle_is_parsed_never_executed(tmp_path: Path) -> None:
    d = tmp_path / "step_3"
    d.mkdir()
    (d / ".metadata").write_bytes(pickle.dumps([_Boom(), "__0_0.distcp"]))
    (d / "__0_0.distcp").write_bytes(b"x")
    assert CheckpointStore(tmp_path).validate(d).status == "unverified"
    assert not Path("/tmp/PWNED-by-checkpoint-metadata").exists()


def test_apply_retention_keeps_last_k_and_milestones_and_never_touches_invalid(tmp_path: Path) -> None:
    for step in range(10, 80, 10):
        make_checkpoint(tmp_path, step, shards=1, size=10, when=1000.0 + step)
    broken = tmp_path / checkpoint_name(30)
    (broken / "__0_0.distcp").unlink()
    stale = tmp_path / ".incomplete-step_000000015-00000000"
    stale.mkdir()
    os.utime(stale, (1000.0, 1000.0))
    removed = CheckpointStore(tmp_path).apply_retention(keep_last=2, keep_every=40)
    assert {p.name for p in removed} == {checkpoint_name(s) for s in (10, 20, 50)} | {stale.name}
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [checkpoint_name(s) for s in (30, 40, 60, 70)]


def test_quarantine_never_overwrites_an_earlier_quarantine(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    first = store.quarantine(make_checkpoint(tmp_path, 1), "first")
    second = store.quarantine(make_checkpoint(tmp_path, 1), "second")
    assert first != second and first.exists() and second.exists()
    assert sorted(q.reason for q in store.quarantined()) == ["first", "second"]
    assert oct((tmp_path / "quarantine").stat().st_mode & 0o777) == "0o700"


# -- CLI ------------------------------------------------------------------------------------------------
def test_cli_json_lists_checkpoints_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_checkpoint(tmp_path, 10)
    bad = make_checkpoint(tmp_path, 20)
    flip_byte(bad / "__0_0.distcp")
    assert cli_main(["checkpoints", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["newest_valid"]["step"] == 20  # quick check cannot see a flipped byte in a shard
    assert cli_main(["checkpoints", str(tmp_path), "--json", "--verify"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["newest_valid"]["step"] == 10
    assert [c["status"] for c in doc["checkpoints"]] == ["invalid", "valid"]
    assert bad.exists(), "listing is read-only without --quarantine"


def test_cli_table_and_exit_6_when_none_valid(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = make_checkpoint(tmp_path, 20)
    (bad / "__0_0.distcp").unlink()
    assert cli_main(["checkpoints", str(tmp_path)]) == 6
    out, err = capsys.readouterr()
    header, row = out.splitlines()[:2]
    assert header.split()[:5] == ["STEP", "AGE", "SIZE", "STATUS", "NAME"]
    assert row.split()[0] == "20" and "invalid" in row and "is missing" in row
    assert err.count("\n") == 1 and "no valid checkpoint" in err


def test_cli_quarantine_flag_moves_invalid_aside(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    make_checkpoint(tmp_path, 10)
    bad = make_checkpoint(tmp_path, 20)
    (bad / "__0_0.distcp").unlink()
    assert cli_main(["checkpoints", str(tmp_path), "--quarantine"]) == 0
    assert not bad.exists() and len(CheckpointStore(tmp_path).quarantined()) == 1


@pytest.mark.parametrize("make", ["missing", "file"])
def test_cli_bad_dir_is_one_clear_line(tmp_path: Path, capsys: pytest.CaptureFixture[str], make: str) -> None:
    target = tmp_path / "nope"
    if make == "file":
        target.write_text("")
    assert cli_main(["checkpoints", str(target)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(target) in err and "fix:" in err


def test_store_and_cli_import_without_torch(tmp_path: Path) -> None:
    make_checkpoint(tmp_path, 10)
    code = ("import sys; sys.modules['torch'] = None\n"
            "from supervisor.checkpoint.store import CheckpointStore\n"
            "from supervisor.cli import main\n"
            f"assert CheckpointStore({str(tmp_path)!r}).newest_valid(full=True).step == 10\n"
            f"assert main(['checkpoints', {str(tmp_path)!r}, '--verify']) == 0\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr

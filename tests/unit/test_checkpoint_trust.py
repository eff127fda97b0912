"""Checkpoint trust (issue 10, finding 2) and single-file checkpoints (issue 9, item 8), on real files.

A planted checkpoint must never be chosen from a root others can write; manifests signed with the
campaign key are trusted, forged ones quarantined; `.metadata` (unpickled by torch) is hashed even by
the quick check; Lightning/torch.save single files are found, ordered and checked without unpickling.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile
from pathlib import Path

import pytest

from supervisor.checkpoint import trust
from supervisor.checkpoint.durable import write_durable
from supervisor.checkpoint.hashing import DEFAULT_ALGORITHM, hash_file
from supervisor.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, parse_manifest
from supervisor.checkpoint.single_file import global_step_in_pickle, step_from_file_name
from supervisor.checkpoint.store import CheckpointStore, checkpoint_name
from supervisor.heartbeat.secret import create_secret

KEY = trust.manifest_key(b"k" * 32)
OTHER = trust.manifest_key(b"o" * 32)


def signed_checkpoint(root: Path, step: int, key: bytes | None = KEY) -> Path:
    d = root / checkpoint_name(step)
    d.mkdir(mode=0o700)
    entries, sha = [], {}
    for name in (".metadata", "__0_0.distcp"):
        (d / name).write_bytes(os.urandom(512))
        entries.append(FileEntry(name, *hash_file(d / name, DEFAULT_ALGORITHM)))
    sha[".metadata"] = trust.sha256_file(d / ".metadata")
    m = Manifest(step=step, time=1.0, world_size=1, hash_algorithm=DEFAULT_ALGORITHM, files=tuple(entries))
    if key is not None:
        m = Manifest(**{**m.__dict__, "auth": trust.make_auth(key, m.to_doc(), sha)})
    write_durable(d / MANIFEST_NAME, m.to_json())
    return d


def planted_dcp(root: Path, step: int) -> Path:
    d = root / f"step_{step}"
    d.mkdir()
    (d / ".metadata").write_bytes(pickle.dumps({"storage": "__0_0.distcp"}))
    (d / "__0_0.distcp").write_bytes(b"x" * 64)
    return d


def torch_like_zip(path: Path, payload: dict, tensor_bytes: bytes = b"\0" * 256) -> Path:
    """The zip layout torch.save writes (archive/data.pkl + archive/data/N, stored), built without torch."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle.dumps(payload, protocol=2))
        zf.writestr("archive/data/0", tensor_bytes)
        zf.writestr("archive/version", "3\n")
    return path


@pytest.fixture
def shared_root(tmp_path: Path) -> Path:
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)  # group/other-writable: anyone could plant a checkpoint here
    return root


# -- trust: signed manifests, foreign checkpoints, the root's owner and mode --------------------------------
def test_private_root_adopts_own_foreign_checkpoints(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o700)
    planted_dcp(tmp_path, 30)
    signed_checkpoint(tmp_path, 20, key=None)
    best = CheckpointStore(tmp_path, key=KEY).newest_valid()
    assert best is not None and best.step == 30 and best.status == "unverified"


def test_shared_root_refuses_foreign_checkpoints_and_picks_the_signed_one(shared_root: Path) -> None:
    planted_dcp(shared_root, 90)
    signed_checkpoint(shared_root, 80, key=None)  # an unsigned manifest is foreign too
    signed_checkpoint(shared_root, 70, key=OTHER)  # another campaign's key
    signed_checkpoint(shared_root, 10)
    store = CheckpointStore(shared_root, key=KEY)
    best = store.newest_valid()
    assert best is not None and best.step == 10
    statuses = {i.step: (i.status, i.reason) for i in store.list()}
    for step in (90, 80, 70):
        status, reason = statuses[step]
        assert status == "refused" and "writable by other users" in reason and "chmod -R go-w" in reason and "CheckpointSaver" in reason
    assert (shared_root / "step_90").exists(), "a refused checkpoint is not moved (it may not be ours)"


def test_adopt_false_refuses_even_in_a_private_root(tmp_path: Path) -> None:
    planted_dcp(tmp_path, 30)
    signed_checkpoint(tmp_path, 20)
    store = CheckpointStore(tmp_path, key=KEY, adopt_foreign=False)
    assert store.newest_valid().step == 20  # type: ignore[union-attr]
    assert "adopt_foreign_checkpoints" in store.list()[0].reason


def test_forged_manifest_is_invalid_and_quarantined(shared_root: Path) -> None:
    signed_checkpoint(shared_root, 10)
    bad = signed_checkpoint(shared_root, 20)
    doc = json.loads((bad / MANIFEST_NAME).read_bytes())
    doc["step"] = 21  # any edit breaks the MAC
    (bad / MANIFEST_NAME).write_text(json.dumps(doc))
    store = CheckpointStore(shared_root, key=KEY)
    assert store.newest_valid().step == 10  # type: ignore[union-attr]
    assert any("forged or altered" in q.reason for q in store.quarantined())


def test_replaced_metadata_is_caught_by_the_quick_check(shared_root: Path) -> None:
    signed_checkpoint(shared_root, 10)
    bad = signed_checkpoint(shared_root, 20)
    size = (bad / ".metadata").stat().st_size
    (bad / ".metadata").write_bytes(b"\x80" + b"c" * (size - 1))  # same size: sizes alone cannot tell
    store = CheckpointStore(shared_root, key=KEY)
    assert store.newest_valid(full=False).step == 10  # type: ignore[union-attr]


def test_campaign_key_comes_from_the_private_secret_file(tmp_path: Path) -> None:
    assert trust.campaign_key(tmp_path / "nope") is None
    create_secret(tmp_path / "c")
    key = trust.campaign_key(tmp_path / "c")
    assert key is not None and len(key) == 32 and trust.campaign_key(tmp_path / "c") == key


def test_signed_manifest_round_trips_through_parse() -> None:
    m = Manifest(step=5, time=2.5, world_size=2, hash_algorithm="crc32", files=(FileEntry(".metadata", 3, "ab"),))
    m = Manifest(**{**m.__dict__, "auth": trust.make_auth(KEY, m.to_doc(), {".metadata": "00"})})
    parsed = parse_manifest(m.to_json())
    assert trust.check_auth(parsed.raw, parsed.auth, KEY) == trust.SIGNED
    assert trust.check_auth(parsed.raw, parsed.auth, OTHER) == trust.FOREIGN
    assert trust.check_auth(parsed.raw, None, KEY) == trust.FOREIGN


# -- single-file checkpoints ---------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "step"), [
    ("epoch=3-step=1200.ckpt", 1200), ("epoch=3-step=1200-v1.ckpt", 1200), ("hpc_ckpt_7.ckpt", 7),
    ("checkpoint-500.pt", 500), ("step-00000040.ckpt", 40), ("model_12.pth", 12), ("last.ckpt", None),
])
def test_step_from_file_name(name: str, step: int | None) -> None:
    assert step_from_file_name(name) == step


def test_lightning_files_are_found_ordered_and_last_ckpt_uses_its_recorded_step(tmp_path: Path) -> None:
    ck = tmp_path / "lightning_logs" / "version_0" / "checkpoints"
    ck.mkdir(parents=True)
    torch_like_zip(ck / "epoch=0-step=100.ckpt", {"epoch": 0, "global_step": 100})
    torch_like_zip(ck / "last.ckpt", {"epoch": 1, "global_step": 250, "state_dict": {}})
    torch_like_zip(tmp_path / "checkpoint-200.pt", {"model": {}})
    store = CheckpointStore(tmp_path)
    assert [(i.path.name, i.step) for i in store.list()] == [
        ("last.ckpt", 250), ("checkpoint-200.pt", 200), ("epoch=0-step=100.ckpt", 100)]
    best = store.newest_valid()
    assert best is not None and best.path.name == "last.ckpt" and best.status == "unverified"


def test_a_torn_single_file_is_quarantined_and_the_previous_chosen(tmp_path: Path) -> None:
    torch_like_zip(tmp_path / "checkpoint-100.pt", {"a": 1})
    full = torch_like_zip(tmp_path / "checkpoint-200.pt", {"a": 2}, b"\1" * 4096).read_bytes()
    (tmp_path / "checkpoint-200.pt").write_bytes(full[: len(full) // 2])  # the save was cut short
    store = CheckpointStore(tmp_path)
    assert store.newest_valid().path.name == "checkpoint-100.pt"  # type: ignore[union-attr]
    (moved,) = store.quarantined()
    assert (moved.path / "checkpoint-200.pt").exists() and "torn" in moved.reason or "damaged" in moved.reason


def test_a_flipped_byte_in_a_tensor_record_is_caught_by_the_full_check_only(tmp_path: Path) -> None:
    torch_like_zip(tmp_path / "checkpoint-100.pt", {"a": 1})
    path = torch_like_zip(tmp_path / "checkpoint-200.pt", {"a": 2}, b"\1" * 4096)
    data = bytearray(path.read_bytes())
    data[data.index(b"\1" * 64) + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    store = CheckpointStore(tmp_path)
    assert store.newest_valid(full=False, quarantine=False).step == 200  # type: ignore[union-attr]
    assert store.newest_valid(full=True).step == 100  # type: ignore[union-attr]


class _Boom:
    def __reduce__(self):  # would run a command if anyone unpickled it
        return (os.system, ("touch /tmp/pwned-by-checkpoint",))


def test_a_hostile_single_file_is_read_but_never_unpickled(tmp_path: Path) -> None:
    marker = Path("/tmp/pwned-by-checkpoint")
    marker.unlink(missing_ok=True)
    torch_like_zip(tmp_path / "last.ckpt", {"global_step": 9, "x": _Boom()})
    legacy = tmp_path / "checkpoint-3.pt"
    legacy.write_bytes(pickle.dumps(_Boom(), protocol=2))
    infos = CheckpointStore(tmp_path).list(full=True)
    assert {i.path.name: i.step for i in infos} == {"last.ckpt": 9, "checkpoint-3.pt": 3}
    assert not marker.exists()


def test_global_step_is_read_from_the_opcodes_only() -> None:
    assert global_step_in_pickle(pickle.dumps({"epoch": 2, "global_step": 77})) == 77
    assert global_step_in_pickle(pickle.dumps({"epoch": 2})) is None
    assert global_step_in_pickle(b"\x80\x02garbage") is None
    buf = io.BytesIO()
    pickle.dump({"global_step": 2**40}, buf)
    assert global_step_in_pickle(buf.getvalue()) == 2**40


def test_single_files_are_refused_from_a_shared_root(shared_root: Path) -> None:
    torch_like_zip(shared_root / "last.ckpt", {"global_step": 5})
    store = CheckpointStore(shared_root, key=KEY)
    assert store.newest_valid() is None
    assert store.list()[0].status == "refused"


def test_lightning_example_resume_from_finds_the_newest_ckpt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys
    import types

    fake = types.ModuleType("lightning.pytorch")
    fake.Callback = object  # type: ignore[attr-defined]  # Lightning itself is not a dependency
    monkeypatch.setitem(sys.modules, "lightning", types.ModuleType("lightning"))
    monkeypatch.setitem(sys.modules, "lightning.pytorch", fake)
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from examples.lightning_callback import resume_from

    monkeypatch.delenv("SUPERVISOR_RESUME_FROM", raising=False)
    assert resume_from(tmp_path / "none") is None
    torch_like_zip(tmp_path / "step-00000010.ckpt", {"global_step": 10})
    torch_like_zip(tmp_path / "step-00000020.ckpt", {"global_step": 20})
    (tmp_path / "step-00000030.ckpt").write_bytes(b"PK\x03\x04 torn")
    assert resume_from(tmp_path) == str(tmp_path / "step-00000020.ckpt")
    monkeypatch.setenv("SUPERVISOR_RESUME_FROM", "")
    assert resume_from(tmp_path) is None  # the supervisor said: fresh start


def test_a_non_ascii_mac_is_forged_not_a_type_error() -> None:
    """Found by bench/fuzz_all.py: hmac.compare_digest raised TypeError on a non-ASCII str."""
    m = Manifest(step=5, time=2.5, world_size=2, hash_algorithm="crc32", files=())
    auth = {**trust.make_auth(KEY, m.to_doc(), {}), "mac": "\ud800"}
    assert trust.check_auth(m.to_doc(), auth, KEY) == trust.FORGED


def test_retention_still_works_for_signed_checkpoints_in_a_shared_root(shared_root: Path) -> None:
    for step in (10, 20, 30):
        signed_checkpoint(shared_root, step)
    planted = planted_dcp(shared_root, 5)
    removed = CheckpointStore(shared_root, key=KEY).apply_retention(keep_last=1)
    assert sorted(p.name.split("step_")[-1] for p in removed) == ["000000010", "000000020"]
    assert planted.exists() and (shared_root / checkpoint_name(30)).exists()


def test_a_torn_deflate_stream_in_a_torch_file_is_a_format_error(tmp_path: Path) -> None:
    """Found by bench/fuzz_all.py (2026-12-04): a data.pkl whose deflate stream is damaged made zipfile raise
    zlib.error, which escaped the checker's typed error."""
    from supervisor.checkpoint import single_file

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"global_step": 20, "pad": "x" * 4000}, protocol=2))
    raw = bytearray(buf.getvalue())
    start = raw.index(b"archive/data.pkl") + len("archive/data.pkl")
    raw[start : start + 3] = b"\xff\xff\xff"  # the first bytes of the compressed stream: an invalid block type
    path = tmp_path / "step-20.pt"
    path.write_bytes(bytes(raw))
    with pytest.raises(single_file.FormatError, match="damaged"):
        single_file.check_file(path, full=False)

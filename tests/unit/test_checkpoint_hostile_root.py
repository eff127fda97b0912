"""A checkpoint root others can write (issue 22, medium findings), played by real users on this machine: the
victim (the campaign's user) picks and quarantines checkpoints as the supervisor does; mallory, another user
(in the victim's group where the case needs it), plants things first. Nothing mallory plants may make the
victim's pick write one of the victim's files, block, exhaust memory, or adopt a checkpoint mallory could have
written. Needs root (to become both users); the CI machine runs as root."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT_REPO = Path(__file__).resolve().parents[2]
VICTIM, MALLORY, GROUP = 61001, 61002, 61000

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="playing two users needs root (CI runs as root)")

PICK = """
import json, sys
from supervisor.checkpoint.store import CheckpointStore
store = CheckpointStore(sys.argv[1])
info = store.newest_valid(full=True, quarantine=True)
print(json.dumps({"chosen": str(info.path) if info else None,
                  "refused": [[str(i.path), i.reason] for i in store.refused],
                  "quarantined": [str(q.path) for q in store.quarantined()]}))
"""
LATEST = """
import sys
from supervisor.checkpoint.store import CheckpointStore
sys.stdin.readline()  # mallory plants the temp name of this pid meanwhile
CheckpointStore(sys.argv[1]).set_latest("step_000000010")
"""


def _as(uid: int, *, umask: int = 0o022) -> dict:
    def become() -> None:
        os.setgroups([GROUP])
        os.setgid(GROUP)
        os.setuid(uid)
        os.umask(umask)

    return {"preexec_fn": become, "env": {"PYTHONPATH": str(ROOT_REPO), "HOME": f"/nonexistent-{uid}",
                                          "PATH": "/usr/bin:/bin"}}  # fmt: skip


def _python() -> str:
    """An interpreter the other users can run (the session's may live under root's 0700 home)."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        try:
            probe = subprocess.run([candidate, "-c", "import supervisor.checkpoint.store"], capture_output=True,
                                   timeout=60, **_as(VICTIM))  # fmt: skip
        except PermissionError:
            continue
        if probe.returncode == 0:
            return candidate
    pytest.fail("no Python interpreter the test users can run with the checkout on their path")


@pytest.fixture
def place() -> Iterator[Path]:
    """A directory both users can reach (pytest's tmp_path is root's 0700)."""
    base = Path(tempfile.mkdtemp(prefix="hostile-root-"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def _victim_dir(path: Path, mode: int = 0o755) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, VICTIM, GROUP)
    os.chmod(path, mode)
    return path


def _by(uid: int, path: Path, data: bytes = b"x", mode: int = 0o644) -> Path:
    path.write_bytes(data)
    os.chown(path, uid, GROUP)
    os.chmod(path, mode)
    return path


def _pick(root: Path, timeout: float = 60.0) -> dict:
    proc = subprocess.run([_python(), "-c", PICK, str(root)], capture_output=True, text=True, timeout=timeout,
                          **_as(VICTIM))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _torch_file(path: Path, uid: int, mode: int = 0o644, step: int = 5) -> Path:
    """A minimal torch.save zip (one data.pkl) that the quick and full checks accept."""
    import io
    import pickle
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"global_step": step}))
    return _by(uid, path, buf.getvalue(), mode)


def test_a_planted_quarantine_link_never_carries_the_victims_checkpoint_elsewhere(place: Path) -> None:
    """Finding: ``quarantine()`` followed a planted ``quarantine`` link; a directory went into ~/.config."""
    home_config = _victim_dir(place / "home" / ".config", 0o700)
    root = _victim_dir(place / "ckpt", 0o777)  # a root others can write
    torn = _victim_dir(root / "step_000000020", 0o755)
    _by(VICTIM, torn / "manifest.json", b"{ torn")
    (root / "quarantine").symlink_to(home_config)
    os.lchown(root / "quarantine", MALLORY, GROUP)
    got = _pick(root)
    assert got["chosen"] is None and got["quarantined"] == []
    assert list(home_config.iterdir()) == []  # nothing moved or written into the link's target
    assert torn.is_dir()  # left where it was (the next newest is tried; nothing is ever deleted)


def test_latest_written_through_a_planted_link_replaces_the_link_not_the_victims_file(place: Path) -> None:
    """Finding: the durable write opened its temp with O_CREAT|O_TRUNC and no O_NOFOLLOW/O_EXCL."""
    bashrc = _by(VICTIM, _victim_dir(place / "home", 0o700) / ".bashrc", b"alias ll='ls -l'\n", 0o644)
    root = _victim_dir(place / "ckpt", 0o777)
    (root / "LATEST").symlink_to(bashrc)
    victim = subprocess.Popen([_python(), "-c", LATEST, str(root)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, **_as(VICTIM))  # fmt: skip
    (root / f".LATEST.tmp-{victim.pid}").symlink_to(bashrc)  # the old temp name was predictable: .NAME.tmp-PID
    _, err = victim.communicate("go\n", timeout=60)
    assert victim.returncode == 0, err
    assert bashrc.read_bytes() == b"alias ll='ls -l'\n"
    assert not (root / "LATEST").is_symlink() and (root / "LATEST").read_text() == "step_000000010\n"


def test_a_fifo_named_metadata_or_a_link_to_dev_zero_neither_blocks_nor_exhausts_the_pick(place: Path) -> None:
    """Finding: a FIFO named ``.metadata`` blocked ``pick_resume`` forever; a link to /dev/zero ate memory."""
    root = _victim_dir(place / "ckpt", 0o755)
    fifo = _victim_dir(root / "checkpoint-30", 0o755)
    os.mkfifo(fifo / ".metadata")
    os.chown(fifo / ".metadata", VICTIM, GROUP)
    _by(VICTIM, fifo / "__0_0.distcp")
    zero = _victim_dir(root / "checkpoint-20", 0o755)
    (zero / ".metadata").symlink_to("/dev/zero")
    os.lchown(zero / ".metadata", VICTIM, GROUP)
    got = _pick(root, timeout=60)  # the old code never returned
    assert got["chosen"] is None


def test_a_foreign_manifest_in_a_shared_root_is_refused_before_its_files_are_read(place: Path) -> None:
    """Finding: foreign ``*.metadata`` files were hashed, with no size cap, before the "refused" verdict."""
    root = _victim_dir(place / "ckpt", 0o777)
    ck = _victim_dir(root / "step_000000040", 0o755)
    os.mkfifo(ck / ".metadata")  # it would block whoever opens it
    from supervisor.checkpoint.manifest import FileEntry, Manifest

    manifest = Manifest(step=40, time=1.0, world_size=1, hash_algorithm="sha256",
                        files=(FileEntry(".metadata", 0, "0" * 64),))  # unsigned: another run's, or mallory's
    _by(MALLORY, ck / "manifest.json", manifest.to_json())
    got = _pick(root, timeout=60)
    assert got["chosen"] is None
    (refused,) = got["refused"]
    assert refused[0].endswith("step_000000040") and "writable by other users" in refused[1]


@pytest.mark.parametrize("case", ["metadata_0664", "last_ckpt_0664", "lightning_group_dir"])
def test_a_foreign_checkpoint_a_group_member_could_have_written_is_never_adopted(place: Path, case: str) -> None:
    """Finding: with umask 002 a member of the user's group got a payload run as the user three ways, though the
    root itself was private; the advice printed (chmod go-w ROOT) led to two of them."""
    root = _victim_dir(place / "ckpt", 0o755)  # private root: the old check looked only here
    if case == "metadata_0664":
        ck = _victim_dir(root / "checkpoint-50", 0o755)
        _by(VICTIM, ck / ".metadata", b"\x80\x04N.", 0o664)  # group-writable: mallory rewrote it
        _by(VICTIM, ck / "__0_0.distcp", b"shard", 0o644)
    elif case == "last_ckpt_0664":
        _torch_file(root / "last.ckpt", VICTIM, 0o664)
    else:
        sub = _victim_dir(root / "lightning_logs" / "version_0" / "checkpoints", 0o775)  # group-writable dir
        _victim_dir(root / "lightning_logs", 0o755)
        _victim_dir(root / "lightning_logs" / "version_0", 0o755)
        _torch_file(sub / "epoch=1-step=60.ckpt", MALLORY, 0o644)
    got = _pick(root)
    assert got["chosen"] is None
    assert got["refused"] and "could have written it" in got["refused"][0][1]
    assert "chmod -R go-w" in got["refused"][0][1] and "CheckpointSaver" in got["refused"][0][1]


def test_the_victims_own_private_checkpoints_are_still_adopted(place: Path) -> None:
    """The README path: a user's own Lightning checkpoint in a private tree is resumed, no config needed."""
    root = _victim_dir(place / "ckpt", 0o755)
    sub = _victim_dir(root / "lightning_logs" / "version_0" / "checkpoints", 0o755)
    _victim_dir(root / "lightning_logs", 0o755)
    _victim_dir(root / "lightning_logs" / "version_0", 0o755)
    ck = _torch_file(sub / "epoch=1-step=60.ckpt", VICTIM, 0o644, step=60)
    got = _pick(root)
    assert got["chosen"] == str(ck) and got["refused"] == []
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o755

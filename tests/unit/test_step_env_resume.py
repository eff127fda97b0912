"""SUPERVISOR_RESUME_FROM: a path, "" (fresh start: the supervisor knows there is nothing), or unset (unknown)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from supervisor.driver.context import Context
from supervisor.driver.launcher import resume_value


@pytest.mark.parametrize(("ckpt_dir", "resume", "scan_ok", "expected"), [
    ("", None, True, None),                   # nobody knows where checkpoints are: left unset, never "fresh start"
    ("/ck", None, True, ""),                  # known directory, nothing valid in it: fresh start
    ("/ck", None, False, None),               # the scan failed: unknown, the program looks itself
    ("/ck", "/ck/step_1", True, "/ck/step_1"),
    ("", "/ck/step_1", True, "/ck/step_1"),
])
def test_resume_env(ckpt_dir, resume, scan_ok, expected, tmp_path):
    from supervisor.decisions.placement import TrainingLayout
    from supervisor.driver.context import Context
    from supervisor.driver.launcher import TrainingLauncher

    trainer = TrainingLauncher(Context.of(lambda e: None), start=None, layout=TrainingLayout(("n1",), 1), command=("x",),  # type: ignore[arg-type]
                               cwd=None, srun_args=(), job_id="7", restart_count=0, campaign=Path("/c"),
                               log_dir=tmp_path, node_addresses={}, checkpoint_dir_known=bool(ckpt_dir),
                               environ={"SUPERVISOR_RESUME_FROM": "/inherited/from/the/batch/env"})  # fmt: skip
    env = trainer.step_env(resume_value(resume, bool(ckpt_dir), scan_ok))
    assert env.get("SUPERVISOR_RESUME_FROM") == expected
    assert env["SUPERVISOR_CAMPAIGN"] == "/c" and "7" in env["SUPERVISOR_SLOT_DIR"]


def test_pick_resume_refuses_a_planted_checkpoint_in_a_shared_root_and_journals_why(tmp_path):
    """Issue 10 finding 2, through the driver: a manifest-less DCP dir planted in a root others can write is
    never handed to the ranks; the campaign's own signed checkpoint is, and the journal says why."""
    import os
    import pickle

    from supervisor.checkpoint import trust
    from supervisor.checkpoint.durable import write_durable
    from supervisor.checkpoint.manifest import FileEntry, Manifest
    from supervisor.driver.checkpoint_tracker import CheckpointTracker
    from supervisor.heartbeat.secret import create_secret
    from supervisor.journal import Journal, read

    def signed_checkpoint(root, step, key):
        d = root / f"step_{step:09d}"
        d.mkdir(mode=0o700)
        (d / ".metadata").write_bytes(b"meta")
        (d / "__0_0.distcp").write_bytes(b"shard")
        m = Manifest(step=step, time=1.0, world_size=1, hash_algorithm="crc32",
                     files=(FileEntry(".metadata", 4, "d7f21435"), FileEntry("__0_0.distcp", 5, "9801adcc")))
        sha = {".metadata": trust.sha256_file(d / ".metadata")}
        write_durable(d / "manifest.json", dataclasses.replace(m, auth=trust.make_auth(key, m.to_doc(), sha)).to_json())

    campaign = tmp_path / "campaign"
    key = trust.manifest_key(create_secret(campaign))
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    signed_checkpoint(root, 10, key=key)
    planted = root / "step_99"
    planted.mkdir()
    (planted / ".metadata").write_bytes(pickle.dumps({"f": "__0_0.distcp"}))
    (planted / "__0_0.distcp").write_bytes(b"x")
    journal = Journal(campaign / "journal.jsonl")
    tracker = CheckpointTracker(Context.of(journal.append), str(root), key=trust.campaign_key(campaign))
    try:
        path, step = tracker.pick_resume()
    finally:
        journal.close()
    assert step == 10 and path.endswith("step_000000010")
    (refused,) = [e for e in read(campaign / "journal.jsonl") if e["type"] == "checkpoint_refused"]
    assert refused["path"] == str(planted) and "fix:" in refused["reason"]


def test_pick_resume_reads_every_shard_a_bit_flip_in_the_newest_falls_back_to_the_previous(tmp_path):
    """The quick check reads sizes and the metadata only: a flipped bit in a shard passes it. The resume pick
    validates fully, quarantines the corrupt checkpoint (journaled) and hands out the previous one."""
    import zipfile

    from supervisor.driver.checkpoint_tracker import CheckpointTracker

    root = tmp_path / "ckpt"
    root.mkdir(mode=0o700)
    for step in (10, 20):  # torch.save's format: an uncompressed zip with a data.pkl and tensor records
        with zipfile.ZipFile(root / f"checkpoint-{step}.pt", "w", zipfile.ZIP_STORED) as zf:
            zf.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
            zf.writestr("archive/data/0", bytes(range(256)) * 64)
    newest = root / "checkpoint-20.pt"
    data = bytearray(newest.read_bytes())
    at = data.index(bytes(range(256))) + 1000
    data[at] ^= 0x10
    newest.write_bytes(bytes(data))
    events: list[dict] = []
    tracker = CheckpointTracker(Context.of(events.append), str(root))
    path, step = tracker.pick_resume()
    assert step == 10 and path.endswith("checkpoint-10.pt")
    (moved,) = [e for e in events if e["type"] == "checkpoint_quarantined"]
    assert "checkpoint-20.pt" in moved["path"] and "CRC" in moved["reason"]

"""Fault matrix, checkpoint faults (issue 9 item 4): a torn newest checkpoint, a bit flip in a shard, the checkpoint
filesystem full during a save. The program (programs/torchsave_train.py) writes plain ``torch.save`` files straight
into its directory, as most programs do, so a crash mid-save leaves a torn file; left to itself it would load the
highest-numbered file. The supervisor validates every candidate fully before each relaunch, quarantines the bad
ones and hands the newest valid one to the ranks (SUPERVISOR_RESUME_FROM).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import pytest
from campaign_tools import cancel, wait_for
from matrix_tools import Row, newest_valid, rank_pid_on, record_time, submit_program, wait_printed

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def flip_a_bit_in_a_tensor_record(path: Path) -> None:
    """Flip one bit inside the first tensor's bytes (a record of torch.save's uncompressed zip)."""
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if "/data/" in i.filename and i.file_size > 64)
    with open(path, "r+b") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        at = info.header_offset + 30 + name_len + extra_len + info.file_size // 2
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x04]))


def test_torn_newest_then_bit_flipped_newest_each_resume_from_the_one_before(tmp_path):
    camp = submit_program(tmp_path, steps=60)
    try:
        # Row: torn newest checkpoint (a crash in the middle of torch.save): rank 1 killed, checkpoint-30 cut short.
        wait_printed(camp, 1, 32)
        torn = camp.ckpt / "checkpoint-30.pt"
        with open(torn, "r+b") as f:
            f.truncate(torn.stat().st_size // 2)
        before = newest_valid(camp.ckpt)
        assert before is not None and before[1] == 20
        t0 = time.time()
        os.kill(rank_pid_on(camp, 1), signal.SIGKILL)
        row = Row(camp, 0)
        row.check("unknown", [], "restart_in_allocation")
        resumed = row.resumed_from(before)
        moved = [e for e in camp.of_type("checkpoint_quarantined") if "checkpoint-30.pt" in e["path"]]
        assert moved and ("torn" in moved[0]["reason"] or "damaged" in moved[0]["reason"]), moved
        record_time("torn newest checkpoint", resumed_s=resumed - t0)

        # Row: bit flip in a shard of the newest checkpoint: sizes and structure intact, one CRC wrong.
        wait_printed(camp, 2, 42)
        flipped = camp.ckpt / "checkpoint-40.pt"
        flip_a_bit_in_a_tensor_record(flipped)
        before = newest_valid(camp.ckpt)
        assert before is not None and before[1] == 30
        t0 = time.time()
        os.kill(rank_pid_on(camp, 0), signal.SIGKILL)
        row = Row(camp, 1)
        row.check("unknown", [], "restart_in_allocation")
        resumed = row.resumed_from(before)
        moved = [e for e in camp.of_type("checkpoint_quarantined") if "checkpoint-40.pt" in e["path"]]
        assert moved and "CRC" in moved[0]["reason"], moved
        record_time("bit flip in a shard", resumed_s=resumed - t0)

        ended = wait_for("the campaign to complete", camp.ended, 120)
        assert ended["state"] == "completed"
        report = camp.report()
        assert [a["outcome"]["class"] for a in report["attempts"]] == ["unknown", "unknown", "completed"]
        assert len(report["checkpoints"]["quarantined"]) == 2
    finally:
        cancel(camp.job_id)


def test_checkpoint_filesystem_full_during_a_save(tmp_path, slurm_cluster):
    """The checkpoint directory is a 384 KiB tmpfs: the third ~150 KiB save fails half-written (torch: "unexpected
    pos"), the rank exits 1. The supervisor restarts it from the newest checkpoint that is whole; the operator
    grows the filesystem meanwhile and the campaign completes."""
    small = tmp_path / "small"
    small.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=384k,mode=0700", "tmpfs", str(small)],
                             capture_output=True, text=True)  # fmt: skip
    assert mounted.returncode == 0, f"mounting a small tmpfs needs root: {mounted.stderr}"
    # Slurm 24.11 in a chroot (docs/local-cluster.md): its /tmp is a private bind mount of the host's, so a mount
    # made on the host afterwards is not seen by the jobs; bind the same tmpfs at the same path inside as well
    # (without it the ranks wrote to the directory underneath, the disk never filled and the row passed nothing).
    chroot = getattr(slurm_cluster, "chroot", None)
    inner = chroot.root / str(small).lstrip("/") if chroot is not None else None
    if inner is not None:
        subprocess.run(["mount", "--bind", str(small), str(inner)], check=True)
    try:
        camp = submit_program(tmp_path, "--hidden", "2048", steps=50, ckpt=small / "ckpt")
        try:
            row = Row(camp, 0)
            got = row.check("app_error", [], "restart_in_allocation")
            assert any("disk" in line.lower() for line in got["evidence"]), got["evidence"]
            t0 = got["t"]
            subprocess.run(["mount", "-o", "remount,size=8m", str(small)], check=True)
            resumed = row.resumed_from((str(camp.ckpt / "checkpoint-20.pt"), 20))
            assert any("checkpoint-30.pt" in e["path"] for e in camp.of_type("checkpoint_quarantined"))
            record_time("checkpoint filesystem full", resumed_s=resumed - t0)
            ended = wait_for("the campaign to complete", camp.ended, 120)
            assert ended["state"] == "completed" and camp.report()["excluded_nodes"] == []
        finally:
            cancel(camp.job_id)
    finally:
        for path in ([inner] if inner is not None else []) + [small]:
            wait_for("the job to let go of the tmpfs",
                     lambda path=path: subprocess.run(["umount", str(path)], capture_output=True).returncode == 0,
                     60)  # fmt: skip

"""`supervise report C | head`: when the reader of stdout goes away, the command stops quietly with 141
(128 + SIGPIPE, as shell tools do), not with a BrokenPipeError traceback on the user's terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from supervisor import campaign

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "demo-journal.jsonl"


def test_a_closed_pipe_ends_the_command_quietly(tmp_path: Path) -> None:
    paths = campaign.create(tmp_path / "c", campaign.CampaignSpec(command=("train",)), "# a campaign\n")
    Path(paths.journal).write_bytes(GOLDEN.read_bytes())
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte (`| head -0`)
    try:
        done = subprocess.run([sys.executable, "-m", "supervisor.cli", "report", str(tmp_path / "c")],
                              stdout=write_end, stderr=subprocess.PIPE, timeout=60)  # fmt: skip
    finally:
        os.close(write_end)
    err = done.stderr.decode()
    assert done.returncode == 141 and err == "", err

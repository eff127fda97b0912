"""The hot path makes no system calls: traced with strace in a real process, a supervised loop of
step / should_checkpoint / should_stop / phase switches issues none between two marker writes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LOOP = r"""
import os
from supervisor import client
client.step(0, loss=1.0)          # first call: discovers the slot, maps it, installs handlers
client.should_checkpoint(); client.should_stop()
os.write(1, b"HOT-BEGIN\n")
for i in range(1, 20001):
    client.step(i, loss=0.5)
    if client.should_checkpoint() or client.should_stop():
        break
    if i % 100 == 0:
        with client.phase("eval"):
            pass
os.write(1, b"HOT-END\n")
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_supervised_hot_loop_makes_no_syscalls(tmp_path: Path) -> None:
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir(mode=0o700)
    trace = tmp_path / "trace.txt"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "RANK", "SLURM_"))}
    env["SUPERVISOR_SLOT_DIR"] = str(slot_dir)
    done = subprocess.run(
        ["strace", "-f", "-qq", "-o", str(trace), sys.executable, "-c", LOOP],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = trace.read_text().splitlines()
    begin = next(n for n, line in enumerate(lines) if "HOT-BEGIN" in line)
    end = next(n for n, line in enumerate(lines) if "HOT-END" in line)
    between = lines[begin + 1 : end]
    assert between == [], between[:10]
    assert (slot_dir / "rank-0.slot").exists()

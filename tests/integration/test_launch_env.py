"""Plain `srun` under the supervisor: every launch exports torch's env:// variables from srun's layout, the
example's ``init_process_group(init_method="env://")`` uses them, and a relaunch in the allocation gets a fresh
MASTER_PORT (no TIME_WAIT, no stale store)."""

from __future__ import annotations

import os
import signal

import pytest
from campaign_tools import cancel, launches, live_rank, submit, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 180  # 4 ranks import torch on 2 shared cores


def environ(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read()
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(): v.decode(errors="replace") for k, _, v in pairs}


def test_env_is_set_from_srun_layout_and_a_relaunch_gets_a_fresh_port(tmp_path):
    camp = submit(tmp_path, steps=40, step_time=0.3, nodes=2, tasks_per_node=2)
    try:
        rows = wait_for("all 4 ranks past step 12",
                        lambda: [r for r in (live_rank(camp.root, k, 12) for k in range(4)) if r] if all(
                            live_rank(camp.root, k, 12) for k in range(4)) else None, START_TIMEOUT)  # fmt: skip
        first = launches(camp)[0]
        addr, port = first["master"].rsplit(":", 1)
        for row in rows:
            env, rank = environ(int(row["pid"])), row["rank"]
            assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"]) == (str(rank), str(rank % 2), str(rank // 2))
            assert (env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("4", "2")
            assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (addr, port) == ("127.0.0.1", port)
            # the flight recorder is on, dumping on a collective timeout into the launch's private directory
            prefix = env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
            assert env["TORCH_FR_DUMP_TEMP_FILE"] == prefix and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
            assert prefix.endswith("train-1.fr/rank_") and (os.stat(os.path.dirname(prefix)).st_mode & 0o777) == 0o700
        os.kill(int(rows[3]["pid"]), signal.SIGKILL)
        second = wait_for("a relaunch", lambda: launches(camp)[1:] or None, 60)[0]
        assert second["master"] != first["master"]
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed"
        attempts = camp.report()["attempts"]
        assert attempts[1]["resume_step"] and attempts[1]["resume_step"] >= 10
        assert not camp.of_type("env_changed")  # the same interpreter, torch, code and world size: nothing to say
    finally:
        cancel(camp.job_id)

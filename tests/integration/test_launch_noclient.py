"""A program that never calls the client (here a POSIX shell script: any binary) is supervised by what can be
seen without heartbeats, as the README promises: its ranks' process state (found in /proc by the node agents; a
stopped rank is a hang), srun's exit codes and its log lines (an exit with an error is an application error and
is relaunched, with the ranks moved), and a clean exit completes the campaign. It also gets the launch's
distributed environment, NODE_RANK following the hostfile when the ranks were moved."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from campaign_tools import Campaign, cancel, launches, supervise, wait_for

pytestmark = [pytest.mark.slurm]

START_TIMEOUT = 90

PROGRAM = """#!/bin/sh
# never calls the client; each rank waits for the test to say how it ends, per launch (by its MASTER_PORT)
f="$1/exit-$MASTER_PORT-$RANK"
echo "rank $RANK of $WORLD_SIZE up, master $MASTER_ADDR:$MASTER_PORT, local rank $LOCAL_RANK"
echo "rank $RANK on $SLURMD_NODENAME node rank $NODE_RANK"
while [ ! -e "$f" ]; do sleep 0.2; done
code=$(cat "$f")
# (srun ends the step at the first bad exit and may drop a dying task's last lines: give them a second)
[ "$code" = 0 ] || { echo "fatal: input shard $RANK is corrupt" >&2; sleep 1; }
exit "$code"
"""


def ranks(camp: Campaign, launch: int) -> dict[int, dict] | None:
    """The live rows of this launch's two ranks once both are running (no heartbeat: process state only)."""
    if len(launches(camp)) != launch:
        return None
    rows = {r["rank"]: r for r in camp.live().get("ranks", []) if r["state"] in ("sleeping", "running")}
    return rows if set(rows) == {0, 1} else None


def finish(tmp: Path, camp: Campaign, codes: dict[int, int]) -> None:
    port = launches(camp)[-1]["master"].rsplit(":", 1)[1]
    for rank, code in codes.items():
        (tmp / f"exit-{port}-{rank}").write_text(str(code))


def test_a_program_without_the_client_is_supervised_by_process_state_exit_codes_and_logs(tmp_path):
    program = tmp_path / "solver.sh"
    program.write_text(PROGRAM)
    program.chmod(0o755)
    root = tmp_path / "campaign"
    out = supervise("submit", "--nodes=2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--",
                    str(program), str(tmp_path))  # fmt: skip
    camp = Campaign(out.stdout.split()[1], root, tmp_path / "none")
    try:
        rows = wait_for("both ranks of launch 1 running", lambda: ranks(camp, 1), START_TIMEOUT)
        assert all(r["beat_age_s"] is None for r in rows.values())  # seen through /proc only
        assert {r["node"] for r in rows.values()} == set(launches(camp)[0]["nodes"])  # one rank on each node
        os.kill(int(rows[1]["pid"]), signal.SIGSTOP)  # process state: a stopped rank is a hang
        second_rows = wait_for("both ranks of launch 2 running", lambda: ranks(camp, 2), 60)
        finish(tmp_path, camp, {1: 3})  # exit code and log line: an application error, relaunched
        wait_for("both ranks of launch 3 running", lambda: ranks(camp, 3), 60)
        finish(tmp_path, camp, {0: 0, 1: 0})  # a clean exit completes the campaign
        ended = wait_for("the campaign to end", camp.ended, 60)
        assert ended["state"] == "completed"
        first, second, third = camp.of_type("interruption")
        assert first["class"] == "hang" and "stopped" in " ".join(first["evidence"])
        failed_on = second_rows[1]["node"]  # whichever nodes Slurm gave the job (an earlier test may hold node1)
        assert second["class"] == "app_error" and f"{failed_on} exited with code 3" in " ".join(second["evidence"])
        assert third["class"] == "completed"
        logs = camp.logs()
        assert "1: fatal: input shard 1 is corrupt" in logs and "rank 1 of 2 up, master 127.0.0.1:" in logs
        # the app error kept to one node and rank: launch 3 moved the ranks (rank 0 on the other node, placed by
        # SLURM_HOSTFILE with --distribution=arbitrary); NODE_RANK follows the placement, not Slurm's node order
        moved = launches(camp)[2]["rank_nodes"]
        assert moved == launches(camp)[1]["nodes"][::-1], launches(camp)
        third_log = next(camp.root.glob("logs/*/train-3.log")).read_text()
        for rank, node in enumerate(moved):
            assert f"rank {rank} on {node} node rank {rank}" in third_log, third_log
    finally:
        cancel(camp.job_id)

"""`supervise submit --script job.sbatch` on the real local Slurm: a team's existing batch script, unchanged,
runs under the supervisor: its #SBATCH lines shape the allocation, its set-up lines (export, cd) run first and
reach the ranks, its srun line's command is the supervised training step."""

from __future__ import annotations

import sys

import pytest
from campaign_tools import Campaign, cancel, supervise, wait_for

pytestmark = [pytest.mark.slurm]

SCRIPT = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=10
#SBATCH --job-name=team-job
export GREETING="hello from the script"
cd {work}
srun --ntasks-per-node=1 {python} prog.py --tag "two words"
"""

PROGRAM = """import os, sys
print(f"rank {os.environ['RANK']}/{os.environ['WORLD_SIZE']} says {os.environ['GREETING']} in {os.getcwd()} "
      f"with {sys.argv[1:]}", flush=True)
"""


def test_an_existing_sbatch_script_runs_supervised(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    (work / "prog.py").write_text(PROGRAM)  # relative to the script's own `cd`
    script = tmp_path / "job.sbatch"
    script.write_text(SCRIPT.format(work=work, python=sys.executable))
    root = tmp_path / "campaign"
    out = supervise("submit", "--script", str(script), "--campaign", str(root))
    camp = Campaign(out.stdout.split()[1], root, tmp_path / "none")
    try:
        ended = wait_for("the campaign to end", camp.ended, 90)
        assert ended["state"] == "completed", camp.of_type("interruption")
        logs = camp.logs()
        for rank in (0, 1):
            assert f"{rank}: rank {rank}/2 says hello from the script in {work} with ['--tag', 'two words']" in logs
        nodes = camp.of_type("step_launched")[0]["nodes"]
        assert len(nodes) == len(set(nodes)) == 2, nodes  # --nodes=2 from the script (which two: Slurm's choice)
        assert "#SBATCH --job-name=team-job" in (root / "batch.sh").read_text()
    finally:
        cancel(camp.job_id)

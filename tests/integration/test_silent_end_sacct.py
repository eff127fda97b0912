"""A Slurm run that ended without its supervisor's word, judged from a real accounting record (issue 26): on a
private local cluster with slurmdbd + MariaDB (``LocalCluster(accounting=True)``), a two-node job loses a node
(its slurmd and job processes SIGKILLed); Slurm ends the job NODE_FAIL. The adapter reads that run back from
``sacct`` and ``silent_end.infer_previous_outcome`` (what the next run of a campaign journals for a run whose
supervisor died with it) names the failed node and quotes the record; with the node back in service, the record
alone still says node failure, blaming nobody (accounting does not say which node failed)."""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest
from test_localcluster import free_port_range, wait_for

from slurm.cli_backend import CliSlurmClient
from slurm.localcluster import LocalCluster
from supervisor.decisions import campaign_state, silent_end
from supervisor.decisions import events as ev

pytestmark = pytest.mark.slurm


def test_a_silent_runs_node_failure_is_read_from_real_sacct() -> None:
    if LocalCluster("/nonexistent", nodes=1).chroot is not None:
        pytest.skip("accounting (slurmdbd + MariaDB) is not carried by the Slurm 24.11 chroot: see docs/local-cluster.md")
    root = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))  # short: unix socket paths must fit in 108 bytes
    cluster = LocalCluster(root, base_port=free_port_range(2 + 3), nodes=2, accounting=True)
    try:
        cluster.up(timeout=120)
        slurm = CliSlurmClient(env=cluster.env)
        job = cluster.slurm("sbatch", "--parsable", "-N2", "--no-requeue", "--wrap", "srun sleep 300").stdout.strip()
        running = wait_for(lambda: (j := slurm.job(job)) is not None and j.state == "RUNNING" and j, 60, "RUNNING")
        started = time.time()
        state = campaign_state.fold([
            ev.campaign_started(started - 5, "/runs/c", ["python3", "train.py"], job),
            ev.attempt_started(started - 1, job, 0, running.nodes, None),  # its supervisor then died with it
        ])  # fmt: skip
        cluster.crash_node("node2")
        runs = wait_for(lambda: [r for r in slurm.history(job) if r.state == "NODE_FAIL"] and slurm.history(job),
                        90, f"sacct to show job {job} NODE_FAIL")  # fmt: skip
        down = [n.name for n in slurm.nodes() if n.is_down]
        assert down == ["node2"], down
        interruption, ended = silent_end.infer_previous_outcome(state, down, None, None, runs)
        assert interruption["class"] == ev.NODE_FAILURE and interruption["blamed_nodes"] == ["node2"], interruption
        line = f"sacct: the previous run of job {job} ended NODE_FAIL"
        assert any(e.startswith(line) for e in interruption["evidence"]), interruption["evidence"]
        assert ended["type"] == ev.ATTEMPT_ENDED and ended["job_id"] == job
        # The node back (ReturnToService=2): the record alone, nobody blamed.
        cluster.revive_node("node2", timeout=60)
        alone, _ = silent_end.infer_previous_outcome(state, [], None, None, slurm.history(job))
        assert alone["class"] == ev.NODE_FAILURE and alone["blamed_nodes"] == [], alone
        assert alone["evidence"][0].startswith(line) and "Slurm ended it for a failed node" in alone["evidence"][0]
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)

"""Node crashes on the real local Slurm (the fault matrix's node-crash rows): a non-batch node lost with a spare
(replaced inside the allocation: same job, same Slurm run), without one (requeued at once, the node excluded),
the batch host lost (the agents' failsafe requeues), and the spares used up (fewer nodes, as min_nodes allows).

A crash is `LocalCluster.crash_node`: SIGKILL of the node's slurmd and of its slurmstepds with their process
trees, so the ranks and the agent there die as on a lost machine while Slurm learns of it only at SlurmdTimeout.
Each test prints its measured times (crash -> verdict, crash -> first iteration of the relaunch).
"""

from __future__ import annotations

import re
import time

import pytest
from campaign_tools import Campaign, cancel, launches, rank_pid, submit, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 180  # job scheduled, agents up, ranks import torch and build the process group (2 shared cores)
STEP = re.compile(r"^\s*\d+: step=(\d+) ", re.M)


def slurm_job(job_id: str):  # type: ignore[no-untyped-def]
    from slurm.cli_backend import CliSlurmClient

    return CliSlurmClient().job(job_id)


def first_step_of(camp: Campaign, name: str, restart: int | None = None) -> float | None:
    """The time an iteration first shows in the launch's log (of any attempt, or of Slurm run ``restart``),
    else None; polled every 0.2 s by the callers, so good to about that."""
    pattern = f"logs/*{'' if restart is None else f'-restart{restart}'}/{name}.log"
    for path in camp.root.glob(pattern):
        if STEP.search(path.read_text(errors="replace")):
            return time.time()
    return None


def training(camp: Campaign, min_step: int) -> tuple[str, list[str]]:
    """(batch host, nodes of the running launch) once rank 0 reached ``min_step``."""
    wait_for(f"rank 0 at step {min_step}", lambda: rank_pid(camp, 0, min_step=min_step), START_TIMEOUT)
    job = slurm_job(camp.job_id)
    return job.batch_host, list(launches(camp)[-1]["nodes"])


def verdict_for(camp: Campaign, node: str) -> dict | None:
    return next((e for e in camp.of_type("node_loss_verdict") if e["verdict"] == "lost" and node in e["nodes"]), None)


def test_a_lost_node_is_replaced_by_a_spare_in_the_same_run(tmp_path, crashable_cluster):
    camp = submit(tmp_path, steps=400, step_time=0.3, config="spare_nodes = 1\n")
    try:
        batch, nodes = training(camp, 12)
        assert len(slurm_job(camp.job_id).nodes) == 3 and len(nodes) == 2  # N+K allocated, N train
        victim = next(n for n in nodes if n != batch)
        crashed = time.time()
        crashable_cluster.crash_node(victim)
        relaunch = wait_for("the relaunch on the spare", lambda: launches(camp)[1:] or None, 60)[0]
        verdict = verdict_for(camp, victim)
        assert verdict is not None and verdict["confirmed_by"] in ("probe", "not_responding")
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "node_failure" and interruption["blamed_nodes"] == [victim]
        assert victim not in relaunch["nodes"] and len(relaunch["nodes"]) == 2 and relaunch["resume_from"]
        resumed = wait_for("an iteration of the relaunch", lambda: first_step_of(camp, "train-2"), 90, poll=0.2)
        print(f"\nspare: crash -> verdict {verdict['t'] - crashed:.1f} s, -> relaunch {relaunch['t'] - crashed:.1f} s, "
              f"-> first resumed iteration {resumed - crashed:.1f} s")
        job = slurm_job(camp.job_id)
        assert job is not None and job.is_running and job.restart_count == 0  # no requeue: same job, same run
        assert len(camp.of_type("attempt_started")) == 1 and not any(
            e["kind"] == "requeue" for e in camp.of_type("action"))
    finally:
        cancel(camp.job_id)


def test_without_a_spare_the_job_is_requeued_at_once_without_the_node(tmp_path, crashable_cluster):
    camp = submit(tmp_path, steps=400, step_time=0.3)
    try:
        batch, nodes = training(camp, 12)
        victim = next(n for n in nodes if n != batch)
        crashed = time.time()
        crashable_cluster.crash_node(victim)
        second = wait_for("the requeued run", lambda: camp.of_type("attempt_started")[1:] or None, 120)[0]
        verdict = verdict_for(camp, victim)
        assert verdict is not None
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "node_failure" and interruption["blamed_nodes"] == [victim]
        requeue = next(e for e in camp.of_type("action") if e["kind"] == "requeue")
        assert requeue["t"] - crashed < 20  # our verdict, not Slurm's DOWN
        assert second["restart"] == 1 and victim not in second["nodes"]
        assert any(victim in e["nodes"] for e in camp.of_type("nodes_excluded"))
        assert victim in slurm_job(camp.job_id).excluded_nodes
        resumed = wait_for("an iteration of the requeued run", lambda: first_step_of(camp, "train-1", restart=1), 120,
                           poll=0.2)  # fmt: skip
        print(f"\nno spare: crash -> verdict {verdict['t'] - crashed:.1f} s, -> requeue {requeue['t'] - crashed:.1f} s, "
              f"-> next run {second['t'] - crashed:.1f} s, -> first resumed iteration {resumed - crashed:.1f} s")
    finally:
        cancel(camp.job_id)


def test_a_lost_batch_host_is_requeued_by_the_agents_failsafe(tmp_path, crashable_cluster):
    camp = submit(tmp_path, steps=400, step_time=0.3, config="spare_nodes = 1\n")
    try:
        batch, _ = training(camp, 12)
        crashed = time.time()
        crashable_cluster.crash_node(batch)
        failsafe = wait_for("the failsafe", lambda: camp.of_type("failsafe") or None, 60)[0]
        assert failsafe["action"] == "requeue" and failsafe["batch_host"] == batch and batch in failsafe["exclude"]
        second = wait_for("the requeued run", lambda: camp.of_type("attempt_started")[1:] or None, 120)[0]
        assert second["restart"] == 1 and batch not in second["nodes"]
        # The journal continues: the new run read the failsafe back as the batch host's failure.
        inferred = camp.of_type("interruption")[0]
        assert inferred["class"] == "node_failure" and inferred["blamed_nodes"] == [batch]
        wait_for("training again", lambda: rank_pid(camp, 0, min_step=1) and launches(camp)[1:], START_TIMEOUT)
        print(f"\nbatch host: crash -> failsafe requeue {failsafe['t'] - crashed:.1f} s (unsupervised until then), "
              f"-> next run {second['t'] - crashed:.1f} s")
        assert failsafe["t"] - crashed < 30
    finally:
        cancel(camp.job_id)


def test_spares_used_up_the_training_goes_on_with_fewer_nodes_when_min_nodes_allows(tmp_path, crashable_cluster):
    camp = submit(tmp_path, steps=400, step_time=0.3, config="spare_nodes = 1\nmin_nodes = 1\n")
    try:
        batch, nodes = training(camp, 12)
        first = next(n for n in nodes if n != batch)
        crashable_cluster.crash_node(first)
        relaunch = wait_for("the relaunch on the spare", lambda: launches(camp)[1:] or None, 60)[0]
        second = next(n for n in relaunch["nodes"] if n != batch)
        wait_for("rank 0 training again", lambda: first_step_of(camp, "train-2"), 90, poll=0.2)
        crashable_cluster.crash_node(second)
        third = wait_for("the relaunch on fewer nodes", lambda: launches(camp)[2:] or None, 60)[0]
        assert third["nodes"] == [batch]
        action = [e for e in camp.of_type("action") if e["kind"] == "restart_in_allocation"][-1]
        assert action["params"].get("fewer_nodes") is True
        # the relaunch resumes a 2-rank checkpoint with 1 rank: said (env_changed, an L2 alert), and only then
        assert third["resume_from"], third
        changed = wait_for("the world-size change said", lambda: camp.of_type("env_changed") or None, 30)
        assert [c["differences"] for c in changed] == [["world size 2 -> 1"]], changed
        job = slurm_job(camp.job_id)
        assert job.restart_count == 0 and len(camp.of_type("attempt_started")) == 1
    finally:
        cancel(camp.job_id)


def test_an_fsdp2_job_shrunk_by_lost_nodes_reshards_its_checkpoint(tmp_path, crashable_cluster):
    """Issue 27, sharded for real: the example with ``--fsdp2`` (sharded DCP), 2 nodes + 1 spare, min_nodes 1. The
    spare replaces the first lost node; after the second, the relaunch runs one rank on one node and loads the
    two ranks' sharded checkpoint resharded: the full weights it restored are the ones saved at that step."""
    camp = submit(tmp_path, steps=400, step_time=0.3, config="spare_nodes = 1\nmin_nodes = 1\n",
                  train=("--fsdp2", "--checksums"))  # fmt: skip
    try:
        batch, nodes = training(camp, 12)
        first = next(n for n in nodes if n != batch)
        crashable_cluster.crash_node(first)
        relaunch = wait_for("the relaunch on the spare", lambda: launches(camp)[1:] or None, 60)[0]
        second = next(n for n in relaunch["nodes"] if n != batch)
        wait_for("rank 0 past a checkpoint of the second launch",
                 lambda: rank_pid(camp, 0, min_step=(relaunch["resume_step"] or 0) + 12), 90)  # fmt: skip
        crashable_cluster.crash_node(second)
        third = wait_for("the relaunch on fewer nodes", lambda: launches(camp)[2:] or None, 60)[0]
        assert third["nodes"] == [batch] and third["resume_step"], third
        log = wait_for("the resharded restore", lambda: next(
            (t for p in camp.root.glob("logs/*/train-3.log") if "restored checksum=" in (t := p.read_text(errors="replace"))),
            None), 90)  # fmt: skip
        assert "checkpoint world size 2 != 1" in log
        restored = re.search(r"restored checksum=(\w+)", log).group(1)  # type: ignore[union-attr]
        earlier = "".join(p.read_text(errors="replace") for p in camp.root.glob("logs/*/train-[12].log"))
        assert f"saved step {third['resume_step']} checksum={restored}" in earlier
        wait_for("rank 0 training on after the reshard", lambda: rank_pid(camp, 0, min_step=third["resume_step"] + 3),
                 60)  # fmt: skip
    finally:
        cancel(camp.job_id)

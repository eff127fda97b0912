"""The memory tier on the real local Slurm (issue 27): README's usage, no memory settings, the example program;
a rank killed from outside (the OOM killer's SIGKILL) is relaunched in the allocation from the snapshot in node
memory (journaled ``memory_pick``, ``resume_tier`` "memory"), losing at most two steps instead of the checkpoint
interval, and the campaign's losses are bitwise those of an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from campaign_tools import EXAMPLE, cancel, launches, step_lines, submit, wait_for
from matrix_tools import printed_step, rank_pid_on, submit_program, wait_printed

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]
STEPS = 40


def reference(tmp_path, world: int = 2) -> list[str]:  # type: ignore[no-untyped-def]
    return reference_of(tmp_path, STEPS, world)


def reference_of(tmp_path, steps: int, world: int = 2,  # type: ignore[no-untyped-def]
                 extra: tuple[str, ...] = ()) -> list[str]:
    """Rank 0's lines of the same training (``extra``: more of the example's flags), uninterrupted, on local
    processes (gloo)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUPERVISOR_", "RANK", "WORLD_SIZE"))}
    outs = [tmp_path / f"ref-rank{r}.out" for r in range(world)]  # files, not pipes: no rank blocks on a full one
    procs = []
    for r in range(world):
        with open(outs[r], "w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, str(EXAMPLE), "--steps", str(steps), "--ckpt-dir", str(tmp_path / "ref"),
                 "--ckpt-every", "20", "--seed", "3", *extra],
                env={**env, "RANK": str(r), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                     "PYTHONWARNINGS": "ignore"}, stdout=out, stderr=subprocess.STDOUT, text=True))  # fmt: skip
    for proc in procs:
        proc.wait(timeout=240)
    return [line for line in outs[0].read_text().splitlines() if line.startswith("step=")]


def test_a_killed_rank_resumes_from_node_memory_losing_at_most_two_steps_bitwise(tmp_path):
    camp = submit(tmp_path, steps=STEPS, ckpt_every=20, step_time=0.3)
    try:
        want = reference(tmp_path)
        wait_printed(camp, 1, 27)
        os.kill(rank_pid_on(camp, 1), signal.SIGKILL)
        killed_at = printed_step(camp, 1)
        picked = wait_for("the memory pick", lambda: camp.of_type("memory_pick"), 90)[0]
        assert picked["launch"] == 2 and picked["fetches"] == 0, picked
        assert picked["step"] is not None and killed_at - 2 <= picked["step"] <= killed_at, (picked, killed_at)
        relaunch = wait_for("the relaunch", lambda: launches(camp)[1:], 30)[0]
        assert relaunch["resume_tier"] == "memory" and relaunch["resume_step"] == picked["step"], relaunch
        assert relaunch["resume_from"].endswith("step_000000020")  # the filesystem tier, were memory refused
        ended = wait_for("the campaign to complete", camp.ended, 180)
        assert ended["state"] == "completed", ended
        report = camp.report()
        assert [a["resume_step"] for a in report["attempts"]] == [None, picked["step"]]
        logs = sorted(camp.root.glob("logs/*/train-*.log"))
        first, second = (step_lines(p.read_text(errors="replace")) for p in logs)
        assert first == want[: len(first)], "launch 1 diverged from the uninterrupted run"
        assert second == want[picked["step"]:], "the resumed steps must print exactly the uninterrupted losses"
    finally:
        cancel(camp.job_id)


def test_a_crashed_node_is_replaced_by_a_spare_that_resumes_from_the_buddys_copy_bitwise(tmp_path, crashable_cluster):
    """Two training nodes and a spare: each node's snapshots are copied to its buddy (the ring over the three);
    the crashed node's memory is wiped with it, so the rank that moves to the spare can only resume from the copy
    its buddy holds: at most two steps lost (the filesystem checkpoint is up to 20 behind), losses bitwise."""
    camp = submit(tmp_path, steps=STEPS, ckpt_every=20, step_time=0.3, config="spare_nodes = 1\n")
    try:
        want = reference(tmp_path)
        wait_printed(camp, 1, 25)
        ring = wait_for("the buddy ring", lambda: camp.of_type("memory_buddies"), 30)[-1]["ring"]
        nodes = launches(camp)[0]["nodes"]
        batch = wait_for("the batch host", lambda: job_batch_host(camp.job_id), 30)
        victim = next(n for n in nodes if n != batch)
        assert ring[victim] not in (victim, None), ring
        crash = crashable_cluster.crash_node(victim)
        killed_at = printed_step(camp, 1)
        assert any(p.endswith(f"-{victim}") for p in crash["wiped"]), crash  # its own snapshots are gone
        picked = wait_for("the memory pick", lambda: camp.of_type("memory_pick"), 90)[0]
        relaunch = wait_for("the relaunch on the spare", lambda: launches(camp)[1:], 30)[0]
        assert victim not in relaunch["nodes"], relaunch
        assert picked["step"] is not None and killed_at - 2 <= picked["step"] <= killed_at, (picked, killed_at)
        assert relaunch["resume_tier"] == "memory" and relaunch["resume_step"] == picked["step"], relaunch
        ended = wait_for("the campaign to complete", camp.ended, 180)
        assert ended["state"] == "completed", ended
        first, second = (step_lines(p.read_text(errors="replace")) for p in sorted(camp.root.glob("logs/*/train-*.log")))
        assert first == want[: len(first)]
        assert second == want[picked["step"]:], "resumed from the buddy's copy: the uninterrupted losses, bitwise"
    finally:
        cancel(camp.job_id)


def job_batch_host(job_id: str) -> str | None:
    from slurm.cli_backend import CliSlurmClient

    job = CliSlurmClient().job(job_id)
    return job.batch_host if job is not None else None


def test_a_time_limit_flushes_the_newest_snapshot_and_the_requeued_job_resumes_from_it_bitwise(tmp_path):
    """A program that never acts on the supervisor's checkpoint request (``--ignore-requests``) and saves to the
    filesystem only at the end: at the time limit nothing new reaches its checkpoint directory, but the node
    agents copy the newest memory snapshot into the campaign directory while the supervisor waits (journaled
    ``memory_flush``); the requeued job, its node memory empty, resumes from that copy (``resume_tier`` memory,
    the flushed step) instead of step 0, and prints bitwise the uninterrupted run's losses from there."""
    steps = 300
    camp = submit(tmp_path, steps=steps, ckpt_every=0, step_time=0.2, sbatch=("--time=1",),
                  config="[submit]\nsignal_lead_s = 30\n", train=("--ignore-requests",))  # fmt: skip
    try:
        want = reference_of(tmp_path, steps)
        # Slurm may send the warning up to a minute early: with --time=1, sometimes before the first snapshot
        # (then the run has nothing to flush, and the next Slurm run is the one that flushes)
        flush = wait_for("the flush at the time limit",
                         lambda: [f for f in camp.of_type("memory_flush") if f["step"] is not None], 240)[0]  # fmt: skip
        assert flush["shards"] == 2, flush
        assert camp.of_type("checkpoint_missed"), "the program saved nothing itself"
        relaunch = wait_for("the requeued job's launch", lambda: [x for x in launches(camp) if x["t"] > flush["t"]],
                            150)[0]  # fmt: skip
        assert relaunch["resume_tier"] == "memory" and relaunch["resume_step"] == flush["step"], relaunch
        _, flushed_run, flushed_launch = flush["snapshot_launch"].split("-")  # JOB-RESTART-LAUNCH
        restart = camp.of_type("attempt_started")[-1]["restart"]
        assert restart == int(flushed_run) + 1  # a new Slurm run: node memory was empty
        log = next(camp.root.glob(f"logs/*restart{restart}/train-{relaunch['launch']}.log"))
        second = wait_for("five resumed steps", lambda: (s := step_lines(log.read_text(errors="replace")))[4:] and s, 120)
        first = step_lines(next(camp.root.glob(f"logs/*restart{flushed_run}/train-{flushed_launch}.log"))
                           .read_text(errors="replace"))  # fmt: skip
        assert first == want[: len(first)] and len(first) >= flush["step"]
        assert second == want[flush["step"]: flush["step"] + len(second)], "resumed from the flushed snapshot, bitwise"
        assert f"resumed from memory at step {flush['step']}" in log.read_text(errors="replace")
    finally:
        cancel(camp.job_id)


def test_a_preempted_job_flushes_the_newest_snapshot_and_the_requeued_job_resumes_from_it_bitwise(tmp_path,
                                                                                                slurm_cluster):
    """Slurm preempts the job for an ``urgent`` one (GraceTime=10). Without ``preempt_send_user_signal`` Slurm
    sends SIGTERM to every step at the start of the grace time, the node agents' included, before the supervisor
    knows why: the test sends the steps that SIGTERM (``scancel --signal=TERM``: every step, not the batch
    shell) a second before the preemption (the local cluster sends the user signal, which alone would give the
    supervisor time to order the flush while the agents run). The program (``--ignore-requests``: SIGTERM ends it unsaved, as a script without a handler) saves nothing; the
    agents, whose node memory holds snapshots, stay for the supervisor's flush order and copy the newest
    snapshot into the campaign directory; the requeued job resumes from that copy instead of step 0, bitwise."""
    steps = 300
    camp = submit(tmp_path, steps=steps, ckpt_every=0, step_time=0.2, train=("--ignore-requests",))
    urgent = None
    try:
        want = reference_of(tmp_path, steps)
        wait_printed(camp, 1, 12)
        slurm_cluster.slurm("scancel", "--signal=TERM", camp.job_id)
        time.sleep(1)
        out = slurm_cluster.slurm("sbatch", "--parsable", "-p", "urgent", "-N", "4", "--exclusive", "--time=1",
                                  "-o", "/dev/null", "--wrap", "sleep 5")  # fmt: skip
        urgent = out.stdout.strip().split(";")[0]
        flush = wait_for("the flush at the preemption", lambda: camp.of_type("memory_flush"), 60)[0]
        assert flush["step"] is not None and flush["step"] >= 10 and flush["shards"] == 2, flush
        relaunch = wait_for("the requeued job's launch", lambda: launches(camp)[1:], 180)[0]
        assert relaunch["resume_tier"] == "memory" and relaunch["resume_step"] == flush["step"], relaunch
        assert camp.of_type("attempt_started")[-1]["restart"] == 1
        assert [e["outcome"]["class"] for e in camp.of_type("attempt_ended")][:1] == ["preemption"]
        log = next(camp.root.glob(f"logs/*restart1/train-{relaunch['launch']}.log"))
        second = wait_for("five resumed steps", lambda: (s := step_lines(log.read_text(errors="replace")))[4:] and s, 120)
        assert second == want[flush["step"]: flush["step"] + len(second)], "resumed from the flushed snapshot, bitwise"
        assert camp.report()["excluded_nodes"] == [], "a preemption blames nobody"
    finally:
        cancel(camp.job_id)
        if urgent:
            cancel(urgent)


def test_a_users_own_dcp_script_resumes_from_node_memory_through_the_storage_writer_bitwise(tmp_path):
    """README's usage with no memory settings and a program written as FSDP2 users write them (plain DCP to
    its --ckpt-dir every 20 steps; node memory through ``DcpMemory``'s storage writer and reader, nothing else of
    ours): rank 1 SIGKILLed near step 27 is relaunched from the snapshot in node memory, losing at most two
    steps instead of the checkpoint interval, and prints the uninterrupted run's losses, bitwise."""
    from test_dcp_memory import PROGRAM as DCP_PROGRAM
    from test_dcp_memory import run

    camp = submit_program(tmp_path, steps=STEPS, ckpt_every=20, step_time=0.3, program=DCP_PROGRAM)
    try:
        want, _ = run(tmp_path / "ref", steps=STEPS)
        wait_printed(camp, 1, 27)
        os.kill(rank_pid_on(camp, 1), signal.SIGKILL)
        killed_at = printed_step(camp, 1)
        picked = wait_for("the memory pick", lambda: camp.of_type("memory_pick"), 90)[0]
        assert picked["step"] is not None and killed_at - 2 <= picked["step"] <= killed_at, (picked, killed_at)
        relaunch = wait_for("the relaunch", lambda: launches(camp)[1:], 30)[0]
        assert relaunch["resume_tier"] == "memory" and relaunch["resume_step"] == picked["step"], relaunch
        ended = wait_for("the campaign to complete", camp.ended, 180)
        assert ended["state"] == "completed", ended
        logs = sorted(camp.root.glob("logs/*/train-*.log"))
        first, second = (step_lines(p.read_text(errors="replace")) for p in logs)
        assert f"resumed from memory at step {picked['step']}" in logs[1].read_text(errors="replace")
        assert first == want[: len(first)]
        assert second == want[picked["step"]:], "resumed through the DCP storage reader: the same losses, bitwise"
    finally:
        cancel(camp.job_id)


def _flip_last_byte(path) -> None:  # type: ignore[no-untyped-def]
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0x01]))


@pytest.mark.parametrize("also_the_copy", [False, True], ids=["buddy-copy-used", "both-corrupt"])
def test_a_corrupted_memory_shard_is_refused_and_the_buddys_copy_or_the_filesystem_is_used(tmp_path, also_the_copy):
    """Rank 1 is SIGKILLed and, at once, every shard it left in its node's memory gets one flipped byte (a bad
    DIMM, a stray write). Its agent re-verifies them against their records and offers none. The pick then takes
    rank 1's shard from the copy its buddy (rank 0's node) holds and has it fetched to rank 1's node, which is
    not the new node of any rank: resumed from memory, bitwise. With the buddy's copies flipped too, nothing
    complete is left in memory: the filesystem checkpoint (step 20), bitwise."""
    camp = submit(tmp_path, steps=STEPS, ckpt_every=20, step_time=0.3)
    try:
        want = reference(tmp_path)
        wait_printed(camp, 1, 25)
        nodes = launches(camp)[0]["nodes"]
        stores = {n: next(Path("/dev/shm").glob(f"supervisor-{camp.job_id}-*-{n}/memory")) for n in nodes}
        os.kill(rank_pid_on(camp, 1), signal.SIGKILL)
        killed_at = printed_step(camp, 1)
        flipped = [p for p in stores[nodes[1]].glob("step_*/rank_1.snap")]
        if also_the_copy:
            flipped += list(stores[nodes[0]].glob(f"replica/{nodes[1]}/step_*/rank_1.snap"))
        for shard in flipped:
            _flip_last_byte(shard)
        assert flipped
        picked = wait_for("the memory pick", lambda: camp.of_type("memory_pick"), 90)[0]
        relaunch = wait_for("the relaunch", lambda: launches(camp)[1:], 30)[0]
        if also_the_copy:
            assert picked["step"] is None and relaunch["resume_tier"] == "filesystem", (picked, relaunch)
            start = 20
        else:
            assert picked["fetches"] >= 1 and picked["step"] is not None, picked
            assert killed_at - 3 <= picked["step"] <= killed_at, (picked, killed_at)
            assert relaunch["resume_tier"] == "memory" and relaunch["resume_step"] == picked["step"], relaunch
            start = picked["step"]
        ended = wait_for("the campaign to complete", camp.ended, 180)
        assert ended["state"] == "completed", ended
        second = step_lines(sorted(camp.root.glob("logs/*/train-*.log"))[1].read_text(errors="replace"))
        assert second == want[start:], "resumed bitwise from what was left intact"
    finally:
        cancel(camp.job_id)


def test_a_node_lost_with_its_buddy_resumes_from_the_filesystem_checkpoint_bitwise(tmp_path, crashable_cluster):
    """Two training nodes and two spares, the ring over all four: the non-batch training node and the node that
    holds its copies (its buddy, a spare) crash together, both memories wiped. Rank 1's shard is left nowhere in
    memory, so nothing complete is: the relaunch on the two remaining nodes resumes from the filesystem
    checkpoint, and prints the uninterrupted run's losses from there, bitwise."""
    camp = submit(tmp_path, steps=STEPS, ckpt_every=20, step_time=0.3, config="spare_nodes = 2\n")
    try:
        want = reference(tmp_path)
        wait_printed(camp, 1, 25)
        ring = wait_for("the buddy ring over four nodes", lambda: (r := camp.of_type("memory_buddies")[-1:])
                        and len(r[0]["ring"]) == 4 and r[0]["ring"], 30)  # fmt: skip
        batch = wait_for("the batch host", lambda: job_batch_host(camp.job_id), 30)
        victim = next(n for n in launches(camp)[0]["nodes"] if n != batch)
        buddy = ring[victim]
        assert buddy not in (batch, victim), (ring, batch)
        crashable_cluster.crash_nodes([victim, buddy])  # together: neither is seen gone while the other runs
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
        picks = camp.of_type("memory_pick")
        assert picks and all(p["step"] is None for p in picks), picks  # rank 1's shard was nowhere any more
        # The spare dies with no rank on it: its loss may be confirmed only after a relaunch tried it (that launch
        # fails and the next one leaves it out). The launch that finished ran on the survivors, from step 20.
        final = launches(camp)[-1]
        assert final["resume_tier"] == "filesystem" and final["resume_step"] == 20, final
        assert not {victim, buddy} & set(final["nodes"]), final
        log = next(camp.root.glob(f"logs/*/train-{final['launch']}.log")).read_text(errors="replace")
        assert step_lines(log) == want[20:], "the filesystem tier, bitwise"
    finally:
        cancel(camp.job_id)


def test_a_node_lost_with_its_buddy_resumes_from_the_snapshot_persisted_while_it_ran_bitwise(tmp_path,
                                                                                             crashable_cluster):  # fmt: skip
    """As above (a training node and its buddy crash together, both memories wiped), but the program saves to the
    filesystem rarely (every 50 steps: none yet) and the agents persist the newest snapshot every 2 s while it
    runs (``[run] memory_persist = 2``, journaled ``memory_persist``): the relaunch resumes from the newest
    persisted step instead of from scratch, and prints the uninterrupted run's losses from there, bitwise."""
    camp = submit(tmp_path, steps=STEPS, ckpt_every=50, step_time=0.3, config="spare_nodes = 2\nmemory_persist = 2\n")
    try:
        want = reference_of(tmp_path, STEPS, extra=("--ckpt-every", "50"))
        wait_printed(camp, 1, 12)
        ring = wait_for("the buddy ring over four nodes", lambda: (r := camp.of_type("memory_buddies")[-1:])
                        and len(r[0]["ring"]) == 4 and r[0]["ring"], 30)  # fmt: skip
        wait_for("a persist", lambda: [e for e in camp.of_type("memory_persist") if e["step"] is not None], 60)
        batch = wait_for("the batch host", lambda: job_batch_host(camp.job_id), 30)
        victim = next(n for n in launches(camp)[0]["nodes"] if n != batch)
        buddy = ring[victim]
        crashable_cluster.crash_nodes([victim, buddy])
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
        persisted = [e for e in camp.of_type("memory_persist") if e["step"] is not None]
        assert persisted and all(e["shards"] == 2 for e in persisted), persisted
        relaunch = next(x for x in launches(camp) if x["launch"] > 1 and x.get("resume_step"))
        first = launches(camp)[0]
        assert relaunch["resume_tier"] == "memory" and relaunch["resume_step"] in {e["step"] for e in persisted}, (
            relaunch, persisted)
        assert relaunch["resume_step"] > 0 and first["launch"] == 1
        assert any(e["t"] > relaunch["t"] and e["step"] > relaunch["resume_step"] for e in persisted), \
            "the relaunch is persisted in its turn"  # fmt: skip
        final = launches(camp)[-1]
        assert not {victim, buddy} & set(final["nodes"]), final
        log = next(camp.root.glob(f"logs/*/train-{final['launch']}.log")).read_text(errors="replace")
        assert step_lines(log) == want[final["resume_step"]:], "resumed from the persisted snapshot, bitwise"
    finally:
        cancel(camp.job_id)


def test_a_node_lost_without_a_spare_flushes_the_buddys_copy_and_the_requeued_job_resumes_from_it_bitwise(
        tmp_path, crashable_cluster):  # fmt: skip
    """Two training nodes, no spare: the crashed node's ranks have nowhere to go in this allocation, so the job is
    requeued without it. Before it lets go of its nodes the surviving agent copies the newest snapshot to the
    filesystem, the crashed node's shard from the copy it holds as its buddy (journaled ``memory_flush``); the
    requeued job resumes from that step (the filesystem checkpoint is up to 20 behind), losses bitwise."""
    camp = submit(tmp_path, steps=STEPS, ckpt_every=20, step_time=0.3)
    try:
        want = reference(tmp_path)
        wait_printed(camp, 1, 25)
        ring = wait_for("the buddy ring", lambda: camp.of_type("memory_buddies"), 30)[-1]["ring"]
        batch = wait_for("the batch host", lambda: job_batch_host(camp.job_id), 30)
        victim = next(n for n in launches(camp)[0]["nodes"] if n != batch)
        assert ring[victim] == batch, ring
        crash = crashable_cluster.crash_node(victim)
        killed_at = printed_step(camp, 1)
        assert any(p.endswith(f"-{victim}") for p in crash["wiped"]), crash
        flush = wait_for("the flush before the requeue",
                         lambda: [f for f in camp.of_type("memory_flush") if f["step"] is not None], 120)[0]  # fmt: skip
        assert flush["shards"] == 2 and killed_at - 2 <= flush["step"] <= killed_at, (flush, killed_at)
        assert flush["step"] > 20  # newer than the filesystem checkpoint
        relaunch = wait_for("the requeued job's launch", lambda: [x for x in launches(camp) if x["t"] > flush["t"]],
                            150)[0]  # fmt: skip
        assert victim not in relaunch["nodes"], relaunch
        assert relaunch["resume_tier"] == "memory" and relaunch["resume_step"] == flush["step"], relaunch
        ended = wait_for("the campaign to complete", camp.ended, 180)
        assert ended["state"] == "completed", ended
        assert [i["class"] for i in camp.of_type("interruption")] == ["node_failure", "completed"]
        restart = camp.of_type("attempt_started")[-1]["restart"]  # the requeued job's Slurm run
        log = next(camp.root.glob(f"logs/*restart{restart}/train-{relaunch['launch']}.log")).read_text(errors="replace")
        assert step_lines(log) == want[flush["step"]:], "resumed from the flushed buddy copy, bitwise"
    finally:
        cancel(camp.job_id)

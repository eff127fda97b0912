"""Fault matrix, Slurm and supervisor faults (issue 9 item 4): preemption, time limit on a loaded machine,
slurmctld restarted mid-run, scancel by the user, the supervisor itself SIGKILLed. (`supervise cancel` is
tests/integration/test_cancel.py.) User-style program: programs/torchsave_train.py; the client only where the
supervisor's checkpoint request must reach the ranks (preemption, time limit).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from campaign_tools import cancel, launches, wait_for
from matrix_tools import (
    START_TIMEOUT,
    Row,
    agent_pids,
    newest_valid,
    printed_step,
    ranks_pids,
    record_time,
    submit_program,
    supervisor_pid,
    wait_printed,
)
from test_fault_matrix_crashes import job_state

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]


def test_preemption_checkpoints_and_slurm_requeues_without_blame(tmp_path, slurm_cluster):
    camp = submit_program(tmp_path, "--client", steps=30, ckpt_every=0)  # only the requested save
    urgent = None
    try:
        wait_printed(camp, 1, 10)
        t0 = time.time()
        out = slurm_cluster.slurm("sbatch", "--parsable", "-p", "urgent", "-N", "4", "--exclusive", "--time=1",
                                  "-o", "/dev/null", "--wrap", "sleep 5")  # fmt: skip
        urgent = out.stdout.strip().split(";")[0]
        row = Row(camp, 0)
        got = row.check("preemption", [], "await_requeue")
        saved = wait_for("the requested checkpoint", lambda: newest_valid(camp.ckpt), 30)
        assert saved[1] >= 10
        resumed = row.resumed_from(saved, timeout=180)
        record_time("preemption", detected_s=got["t"] - t0, resumed_s=resumed - t0)
        ended = wait_for("the campaign to complete after the requeue", camp.ended, 200)
        assert ended["state"] == "completed"
        report = camp.report()
        assert report["attempts"][1]["restart"] == 1 and report["excluded_nodes"] == []
    finally:
        cancel(camp.job_id)
        if urgent:
            cancel(urgent)


def test_time_limit_on_a_loaded_machine_checkpoints_then_requeues_without_blame(tmp_path):
    """--time=1 with a 45 s lead: USR1 within seconds of the start. Two busy loops load both cores the whole
    time: the request must still come early enough and its completion be awaited."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        camp = submit_program(tmp_path, "--client", steps=2000, step_time=0.2, ckpt_every=0, sbatch=("--time=1",),
                              config="[submit]\nsignal_lead_s = 45\n[run]\ncheckpoint_grace_s = 30\n")  # fmt: skip
        try:
            row = Row(camp, 0)
            got = row.check("timeout", [], "requeue")
            saved = newest_valid(camp.ckpt)
            asked = camp.of_type("checkpoint_requested")[0]["t"]
            stepped = [e for e in camp.of_type("step_progress") if e["launch"] == 1 and e["step_t"] < asked]
            if saved is None and not stepped:
                # No rank had made a first step when the request came (seen at load 11 on the 2 cores: start-up
                # took longer than the 15 s --time=1 leaves): nothing to save, the miss is journaled, the next
                # run starts from the beginning.
                assert camp.of_type("checkpoint_missed"), "a checkpoint that could not be saved is journaled"
            else:
                assert saved is not None, "the ranks did not save before the requeue"
                assert camp.of_type("checkpoint_committed") and not camp.of_type("checkpoint_missed")
            resumed = row.resumed_from(saved, timeout=200)
            record_time("time limit (loaded)", resumed_s=resumed - got["t"])
            assert camp.of_type("attempt_started")[1]["restart"] == 1
        finally:
            cancel(camp.job_id)
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()


def wait_job_state_saved(cluster, job_id: str) -> None:
    """Wait until slurmctld has written its job state file since the job started. slurmctld saves state a few
    seconds after a change: killed sooner, it recovers the job as still PENDING, allocates it again and drains the
    node that already runs it ("Duplicate jobid"), which is Slurm's own behaviour, not the row this test checks."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
    started = time.mktime(time.strptime(fields["StartTime"], "%Y-%m-%dT%H:%M:%S"))  # scontrol prints local time
    saved = cluster.layout.state / "job_state"
    wait_for("slurmctld to save the running job's state",
             lambda: saved.exists() and saved.stat().st_mtime >= started + 1, 30)  # fmt: skip


def test_slurmctld_restarted_mid_run_is_ridden_through_then_scancel_is_final(tmp_path, crashable_cluster):
    slurm_cluster = crashable_cluster
    camp = submit_program(tmp_path, steps=1000, step_time=0.2)
    try:
        wait_printed(camp, 1, 10)
        wait_job_state_saved(slurm_cluster, camp.job_id)
        # Row: slurmctld SIGKILLed, down 10 s, restarted (recovers the job from its state file).
        ctld = slurm_cluster.pid_of("slurmctld")
        assert ctld is not None
        os.kill(ctld, signal.SIGKILL)
        time.sleep(10)
        slurm_cluster.up(timeout=60)
        at = printed_step(camp, 1)
        wait_printed(camp, 1, at + 15, timeout=60)
        assert not camp.of_type("interruption") and len(launches(camp)) == 1
        assert job_state(camp.job_id)[0] == "RUNNING"

        # Row: scancel by the user (the job has a time limit): cancelled, final, nothing left running.
        pids = ranks_pids(camp)
        assert len(pids) == 2
        t0 = time.time()
        cancel(camp.job_id)
        got = Row(camp, 0).check("cancelled", [], "stop")
        ended = wait_for("the campaign to end", camp.ended, 60)
        assert ended["state"] == "stopped"
        assert not [e for e in camp.of_type("action") if e["kind"] in ("requeue", "await_requeue", "hold")]
        wait_for("every rank and agent to be gone", lambda: not ranks_pids(camp) and not agent_pids(camp), 30)
        state = wait_for("the job to end", lambda: (s := job_state(camp.job_id) or ("GONE", 0))[0]
                         not in ("RUNNING", "COMPLETING", "PENDING", "REQUEUED") and s, 60)  # fmt: skip
        assert state[1] == 0 and len(launches(camp)) == 1
        record_time("scancel", detected_s=got["t"] - t0, stopped_s=ended["t"] - t0)
    finally:
        cancel(camp.job_id)


def test_supervisor_sigkill_the_next_run_continues_from_the_journal(tmp_path):
    """The supervisor runs as the batch script's child: SIGKILLed mid-run (nothing told the job to end), the
    script requeues the job, and its next run continues the campaign from the journal: the killed run's end
    inferred (unknown, nobody blamed), resumed from the newest valid checkpoint, completed, nothing duplicated."""
    camp = submit_program(tmp_path, steps=60)
    try:
        wait_printed(camp, 1, 23)
        pid = supervisor_pid(camp)
        assert pid is not None
        t0 = time.time()
        os.kill(pid, signal.SIGKILL)
        wait_for("its ranks and agents to be gone (Slurm ends the requeued run's steps)",
                 lambda: not ranks_pids(camp) and not agent_pids(camp), 60)  # fmt: skip
        assert camp.ended() is None and len(camp.of_type("attempt_started")) == 1
        before = newest_valid(camp.ckpt)
        assert before is not None and before[1] >= 20
        requeued = wait_for("the next run of the job", lambda: camp.of_type("attempt_started")[1:] or None,
                            START_TIMEOUT)[0]  # fmt: skip
        assert requeued["restart"] == 1 and requeued["job_id"] == camp.job_id
        row = Row(camp, 0)
        got = row.interruption(timeout=60)
        assert got["class"] == "unknown" and got["blamed_nodes"] == []
        assert any("died of signal 9" in line for line in got["evidence"]), got["evidence"]
        assert not camp.of_type("failsafe")  # the batch host is alive: the agents' failsafe never acts
        resumed = row.resumed_from(before, timeout=START_TIMEOUT)
        record_time("supervisor SIGKILL", next_run_s=requeued["t"] - t0, resumed_s=resumed - t0)
        ended = wait_for("the campaign to complete", camp.ended, 120)
        assert ended["state"] == "completed" and len(camp.of_type("campaign_started")) == 1
        assert len(camp.of_type("attempt_started")) == 2
        assert [e["class"] for e in camp.of_type("interruption")] == ["unknown", "completed"]
        batch_log = (camp.root / "logs" / f"batch-{camp.job_id}.out").read_text()
        said = [line for line in batch_log.splitlines() if line.startswith("supervise: the supervisor died")]
        assert len(said) == 1 and "signal 9" in said[0] and "requeued the job" in said[0], said
    finally:
        cancel(camp.job_id)

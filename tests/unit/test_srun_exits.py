"""A program that never calls the client leaves no exit code an agent can read (its ranks are not the agent's
children): srun's own lines in the launch log are where its exit codes are. Recorded from the local cluster."""

from __future__ import annotations

from supervisor.decisions import events as ev
from supervisor.decisions.classify import classify
from supervisor.driver import evidence
from supervisor.driver.evidence import WatchResult

LOG = """\
0: rank 0 of 2 up, master 127.0.0.1:29228, local rank 0
1: rank 1 of 2 up, master 127.0.0.1:29228, local rank 0
srun: error: node2: task 1: Exited with exit code 3
srun: launch/slurm: _step_signal: Terminating StepId=1701002.2
0: slurmstepd-node1: error: *** STEP 1701002.2 ON node1 CANCELLED AT 2026-12-03T08:18:06 ***
srun: error: node1: task 0: Terminated
srun: Force Terminated StepId=1701002.2
""".splitlines()


def test_an_exit_code_seen_only_by_srun_is_an_application_error_not_unknown():
    found = evidence.build(
        WatchResult("exited", exit_code=143), now=100.0, ranks=[], sigterm_flag=1, job=None, job_known=True,
        nodes={}, log_lines=LOG, step_nodes=("node1", "node2"), job_nodes=("node1", "node2"), signal_lead_s=120,
        scheduled_end=None,
    )  # fmt: skip
    got = classify(found)
    assert got.cls == ev.APP_ERROR, got
    assert any("node2 exited with code 3" in line for line in got.evidence), got.evidence
    assert got.blamed_nodes == ()  # an application error blames no node the first time

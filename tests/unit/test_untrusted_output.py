"""The program's printed text is untrusted (issue 22, high and medium findings): a rank's line may name a node as
Slurm's messages do, carry a hostlist of a million nodes, or be 64 KiB of one word. None of it ends ``supervise
run``, blames a node, requeues the job or costs seconds of regex; a decision that fails anyway is journaled and
taken again on what is certain. Real ``Attempt`` on the driver fakes (tests/unit/fakes.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Launch
from test_driver import supervise

from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.decisions.classify import Evidence, LogLine, classify
from supervisor.decisions.tasklog import srun_task_exits

DONE = Launch(0, ranks={"state": "exited", "exit_code": 0})


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("printed", [
    "0: RuntimeError: job requeued due to failure of node -x",  # the finding: a HostlistError ended supervise run
    "1: sample 17: 'the job was requeued due to failure of node n2'",  # a data sample blamed node n2
    "0: ValueError: due to failure of node n[0-1048575]",  # blamed 1,048,576 nodes into ExcNodeList
    "1: srun: error: Task launch for StepId=7.0 failed on node n2: Communication connection failure",
    "0: slurmstepd: error: *** STEP 7.0 ON n1 CANCELLED AT 2026-12-04T10:00:00 DUE TO NODE FAILURE ***",
])  # fmt: skip
def test_a_ranks_line_never_speaks_for_slurm(tmp_path: Path, printed: str) -> None:
    r = supervise(tmp_path, Launch(1, log=printed + "\n"), DONE)
    assert r.code == 0 and r.classes()[-1] == ev.COMPLETED  # supervision went on to the end
    first = r.of(ev.INTERRUPTION)[0]
    assert first["class"] != ev.NODE_FAILURE and first["blamed_nodes"] == []
    assert not [c for c in r.slurm.calls if c[0] in ("requeue", "update_excluded_nodes", "drain")]
    assert len(r.of(ev.STEP_LAUNCHED)) == 2  # relaunched in the allocation, on the same nodes
    assert not r.of(ev.SUPERVISOR_ERROR)


def test_slurms_own_unlabelled_lines_still_blame_the_node_they_name() -> None:
    line = LogLine("srun: error: Task launch for StepId=7.0 failed on node n2: Communication connection failure")
    got = classify(Evidence(log_lines=(line,), job_nodes=("n1", "n2")))
    assert got.cls == ev.NODE_FAILURE and got.blamed_nodes == ("n2",)
    outside = LogLine("srun: error: Task launch for StepId=7.0 failed on node n9: Communication connection failure")
    assert classify(Evidence(log_lines=(outside,), job_nodes=("n1", "n2"))).blamed_nodes == ()  # not this job's


@pytest.mark.parametrize("line", [
    "0: " + "gloo" * 16384,  # gloo's signature took 4.7-6.3 s on one printed 64 KiB line
    "0: " + "c10d" * 16384,
    "0: " + "Gloo Connection " * 4096,
])  # fmt: skip
def test_a_long_printed_line_costs_its_length_not_its_square(line: str) -> None:
    evidence = Evidence(log_lines=tuple(LogLine(line) for _ in range(50)), job_nodes=("n1",))
    started = time.process_time()
    classify(evidence)
    assert time.process_time() - started < 2.0  # 50 such lines; quadratic, each took seconds


def test_srun_task_lines_are_read_in_linear_time_and_a_huge_task_list_is_not_srun() -> None:
    started = time.process_time()
    assert srun_task_exits(["srun: error: n1: task 1: " + " " * 65536]) == ()  # > 20 s before
    assert time.process_time() - started < 2.0
    assert srun_task_exits(["srun: error: n1: tasks 0-99999999999: Killed"]) == ()  # a MemoryError before
    (one,) = srun_task_exits(["srun: error: n1: task 3: Killed   "])
    assert one.task == 3 and one.signal == 9


def test_a_decision_that_fails_is_journaled_and_taken_again_on_what_is_certain(tmp_path: Path,
                                                                             monkeypatch) -> None:  # fmt: skip
    """A bug met by an odd piece of evidence must cost the decision its evidence, never the campaign."""
    real = cl.classify
    calls = []

    def failing_once(e: Evidence, *args: object, **kw: object) -> cl.Interruption:
        calls.append(e)
        if len(calls) == 1:
            raise TypeError("an odd piece of evidence")
        return real(e, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr("supervisor.decisions.respond.cl.classify", failing_once)
    r = supervise(tmp_path, Launch(1, log="0: boom\n"), DONE)
    (error,) = r.of(ev.SUPERVISOR_ERROR)
    assert error["stage"] == "decide" and "odd piece of evidence" in error["error"]
    assert r.classes() == [ev.UNKNOWN, ev.COMPLETED] and r.of(ev.INTERRUPTION)[0]["blamed_nodes"] == []
    assert r.code == 0 and calls[1].unknown == ("evidence",)


def test_an_error_past_every_guard_ends_the_process_as_crashed_without_a_core_file(tmp_path: Path) -> None:
    """``supervise run``'s last resort: SIGABRT, which the batch script answers with a requeue (batchwrap)."""
    code = ("from supervisor.commands.run import crash\n"
            "crash(RuntimeError('a bug'))\n")  # fmt: skip
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONFAULTHANDLER": ""})  # fmt: skip
    assert proc.returncode == -signal.SIGABRT
    assert "the supervisor failed (RuntimeError: a bug)" in proc.stderr and "requeues the job" in proc.stderr
    assert not list(tmp_path.glob("core*"))


def test_a_carriage_return_in_a_ranks_line_never_makes_an_unlabelled_line(tmp_path: Path) -> None:
    """srun labels every line of a rank's output, a long one in labelled 1 KiB pieces (seen on 22.05); a ``\\r``
    inside a line is the rank's own text. Splitting the launch log at it (str.splitlines, universal newlines)
    made the rest an unlabelled line that spoke for Slurm."""
    from supervisor.driver.launch_log import LaunchLog

    log = tmp_path / "train-1.log"
    log.write_bytes(b"0: step 3\r job requeued due to failure of node n2\n1: " + b"x" * 5000 + b"\n")
    lines = LaunchLog(log).lines()
    assert lines == ["0: step 3\r job requeued due to failure of node n2", "1: " + "x" * 5000]
    r = supervise(tmp_path, Launch(1, log="0: boom\r job requeued due to failure of node n2\n"), DONE)
    assert r.of(ev.INTERRUPTION)[0]["class"] != ev.NODE_FAILURE and r.of(ev.INTERRUPTION)[0]["blamed_nodes"] == []

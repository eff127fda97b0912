"""The batch script's own logic (supervisor/batchwrap.py), run for real under dash and bash: a fake supervisor
(the script's "python") and a fake ``scontrol`` on PATH; real processes and signals, no Slurm.

The supervisor is the shell's child: Slurm's signals reach it through the shell, its exit status is the job's,
and only its death by a signal nobody sent the job (SIGKILL, the OOM killer) makes the shell requeue the job."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from supervisor.batchwrap import DIED_MARK
from supervisor.commands import submit

SHELLS = [s for s in ("sh", "dash", "bash") if shutil.which(s)]
SHELLS = sorted({os.path.realpath(shutil.which(s) or s): s for s in SHELLS}.values())  # sh is often dash

FAKE_SUPERVISOR = """\
import os, signal, sys, time
mode, log = os.environ["FAKE_MODE"], os.environ["FAKE_LOG"]
def note(word):
    with open(log, "a") as f:
        f.write(word + "\\n")
def on(signum, frame):
    note(signal.Signals(signum).name)
    if mode == "killed-after-usr1" and signum == signal.SIGUSR1:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "usr1-exits3" and signum == signal.SIGUSR1:
        sys.exit(3)

    if mode == "killed-after-term" and signum == signal.SIGTERM:
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "counts-usr1" and signum == signal.SIGUSR1:
        return
    if signum in (signal.SIGTERM, signal.SIGINT):
        sys.exit(1)
note("usr1 " + ("ignored" if signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN else "default"))
if mode == "slow-start":  # as the real one: a while before it listens (imports, config)
    note("ready")
    time.sleep(1.5)
    sys.exit(4)
for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGCONT):
    signal.signal(s, on)
if mode == "dies-of-usr1":
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
if mode == "dies-of-term":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
note("ready " + " ".join(sys.argv[1:]))
if mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode.startswith("exit"):
    sys.exit(int(mode[4:]))
if mode == "counts-usr1":  # takes USR1s for 3 s, then exits 5 itself
    end = time.monotonic() + 3
    while time.monotonic() < end:
        time.sleep(0.01)
    sys.exit(5)
while True:
    time.sleep(0.02)
"""


def _setup(tmp_path: Path, scontrol_rc: int = 0) -> tuple[Path, dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "fake-python"
    fake.write_text(f"#!{sys.executable}\n{FAKE_SUPERVISOR}")
    fake.chmod(0o755)
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> "$SCONTROL_LOG"\n'
                        f'if [ "$1" = show ]; then echo "JobId=4242 JobName=x PreemptTime=$FAKE_PREEMPT_TIME '
                        f'SuspendTime=None"; exit 0; fi\n'
                        f'[ {scontrol_rc} = 0 ] || echo "scontrol: error: Access/permission denied" >&2\n'
                        f'exit {scontrol_rc}\n')  # fmt: skip
    scontrol.chmod(0o755)
    args = submit.parse_argv(["-N", "2", "--campaign", str(tmp_path / "camp"), "--", "python", "train.py"])
    args.python = str(fake)
    _, _, text, _ = submit.build(args, now=0.0)
    script = tmp_path / "batch.sh"
    script.write_text(text)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "4242",
           "SLURM_RESTART_COUNT": "0", "FAKE_LOG": str(tmp_path / "fake.log"),
           "SCONTROL_LOG": str(tmp_path / "scontrol.log"), "FAKE_PREEMPT_TIME": "None"}  # fmt: skip
    return script, env


def _notes(tmp_path: Path, name: str = "fake.log") -> list[str]:
    path = tmp_path / name
    return path.read_text().splitlines() if path.exists() else []


def _ours(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("supervise:")]


def _run(tmp_path: Path, shell: str, mode: str, signals: tuple[int, ...] = (), scontrol_rc: int = 0,
         preempt_time: str = "None", burst: int = 1, then_term_on: str | None = None):
    script, env = _setup(tmp_path, scontrol_rc)
    proc = subprocess.Popen([shell, str(script)], env={**env, "FAKE_MODE": mode, "FAKE_PREEMPT_TIME": preempt_time},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not any(n.startswith("ready") for n in _notes(tmp_path)) and proc.poll() is None:
        assert time.monotonic() < deadline, "the fake supervisor never started"
        time.sleep(0.02)
    for signum in signals:  # as Slurm does: to the batch shell only (--signal=B:USR1, scancel --batch)
        time.sleep(0.2)
        for _ in range(burst):
            proc.send_signal(signum)
    if then_term_on is not None:  # Slurm's TERM at the end of a preemption's grace time
        while then_term_on not in _notes(tmp_path, "scontrol.log") and proc.poll() is None:
            assert time.monotonic() < deadline + 30, "the script never asked Slurm about the job"
            time.sleep(0.05)
        time.sleep(0.5)
        assert proc.poll() is None, "the script ended before Slurm's TERM"
        proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, err, _notes(tmp_path), _notes(tmp_path, "scontrol.log")


ASKED = "show job -o 4242"


@pytest.mark.parametrize("shell", SHELLS)
def test_a_supervisor_killed_by_sigkill_requeues_the_job(tmp_path, shell):
    code, err, notes, scontrol = _run(tmp_path, shell, "sigkill")
    assert scontrol == [ASKED, "requeue 4242"]
    assert code == 0
    assert notes[1] == f"ready -m supervisor.cli run --campaign {tmp_path / 'camp'}"
    ours = _ours(err)  # (the shell itself may say "Killed" about its child too)
    assert len(ours) == 1 and ours[0].startswith(f"{DIED_MARK} 9 in job 4242 run 0") and "requeued the job" in ours[0]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_failed_requeue_ends_the_job_failed_with_one_line(tmp_path, shell):
    code, err, _, scontrol = _run(tmp_path, shell, "sigkill", scontrol_rc=1)
    assert scontrol == [ASKED, "requeue 4242"]
    assert code == 137
    ours = _ours(err)
    assert len(ours) == 1 and "'scontrol requeue 4242' failed: the job ends here" in ours[0]


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("status", [0, 1, 6, 130])
def test_the_supervisors_own_exit_decides_and_nothing_is_requeued(tmp_path, shell, status):
    code, err, _, scontrol = _run(tmp_path, shell, f"exit{status}")
    assert (code, scontrol, err) == (status, [], "")


@pytest.mark.parametrize("shell", SHELLS)
def test_term_is_passed_on_and_never_leads_to_a_requeue(tmp_path, shell):
    """scancel, the time limit or a requeue: TERM reaches the supervisor, which decides; the shell only waits."""
    code, err, notes, scontrol = _run(tmp_path, shell, "wait", (signal.SIGTERM,))
    assert notes[2:] == ["SIGTERM"] and code == 1 and scontrol == [] and err == ""


@pytest.mark.parametrize("shell", SHELLS)
@pytest.mark.parametrize("mode", ["dies-of-term", "killed-after-term"])
def test_a_supervisor_killed_after_the_job_was_told_to_end_is_not_requeued(tmp_path, shell, mode):
    """Slurm's SIGKILL after KillWait (scancel, time limit) or a supervisor dying of the TERM: the job ends."""
    code, err, _, scontrol = _run(tmp_path, shell, mode, (signal.SIGTERM,))
    assert scontrol == [] and _ours(err) == []
    assert code == (143 if mode == "dies-of-term" else 137)


@pytest.mark.parametrize("shell", SHELLS)
def test_usr1_and_cont_are_passed_on_and_the_wait_goes_on(tmp_path, shell):
    """USR1 (time limit near) cuts the shell's wait short: it waits again and returns the supervisor's status."""
    code, _, notes, scontrol = _run(tmp_path, shell, "usr1-exits3", (signal.SIGCONT, signal.SIGUSR1))
    assert notes[2:] == ["SIGCONT", "SIGUSR1"] and code == 3 and scontrol == []


@pytest.mark.parametrize("shell", SHELLS)
def test_a_burst_of_usr1_never_passes_for_the_supervisors_end(tmp_path, shell):
    """Each USR1 cuts the shell's wait short with status 138 while the supervisor runs on. Deciding "it ended"
    from a counter the trap bumps raced in bash (the old loop returned 138 and requeued a healthy job)."""
    code, err, notes, scontrol = _run(tmp_path, shell, "counts-usr1", (signal.SIGUSR1,) * 6, burst=150)
    assert (code, scontrol, _ours(err)) == (5, [], [])


@pytest.mark.parametrize("shell", SHELLS)
def test_the_supervisor_starts_with_usr1_ignored_so_an_early_one_never_kills_it(tmp_path, shell):
    """Slurm's USR1 before the supervisor listens (python still importing) is dropped, not fatal: it exits 4."""
    code, err, notes, scontrol = _run(tmp_path, shell, "slow-start", (signal.SIGUSR1, signal.SIGUSR1))
    assert notes[0] == "usr1 ignored"
    assert (code, scontrol, _ours(err)) == (4, [], [])


@pytest.mark.parametrize("shell", SHELLS)
def test_a_death_by_usr1_is_not_a_crash_and_is_not_requeued(tmp_path, shell):
    code, err, _, scontrol = _run(tmp_path, shell, "dies-of-usr1", (signal.SIGUSR1,))
    assert (code, scontrol, _ours(err)) == (138, [], [])


@pytest.mark.parametrize("shell", SHELLS)
def test_a_supervisor_killed_after_usr1_is_still_requeued(tmp_path, shell):
    """USR1 does not end the job: a supervisor OOM-killed while it checkpoints before the time limit is requeued."""
    code, _, notes, scontrol = _run(tmp_path, shell, "killed-after-usr1", (signal.SIGUSR1,))
    assert notes[2:] == ["SIGUSR1"] and code == 0 and scontrol == [ASKED, "requeue 4242"]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_supervisor_killed_during_a_preemption_leaves_the_requeue_to_slurm(tmp_path, shell):
    """Preempted (PreemptTime set): the ranks may still be saving in the grace time, and Slurm requeues the job
    when it ends. The shell says so, requeues nothing and waits for Slurm's TERM."""
    code, err, notes, scontrol = _run(tmp_path, shell, "killed-after-usr1", (signal.SIGUSR1,),
                                      preempt_time="2026-12-03T14:40:02", then_term_on=ASKED)  # fmt: skip
    assert scontrol == [ASKED] and code == 137
    ours = _ours(err)
    assert len(ours) == 1 and "but a preemption: Slurm requeues the job" in ours[0]


@pytest.mark.parametrize("shell", SHELLS)
def test_set_e_and_set_u_in_an_adopted_scripts_set_up_do_not_break_it(tmp_path, shell):
    """An adopted script's set-up lines run first; `set -eu` there must not end the shell at the first `wait`."""
    script, env = _setup(tmp_path)
    done = subprocess.run([shell, "-eu", str(script)], env={**env, "FAKE_MODE": "sigkill"}, capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0 and _notes(tmp_path, "scontrol.log") == [ASKED, "requeue 4242"]

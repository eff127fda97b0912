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
    if signum in (signal.SIGTERM, signal.SIGINT):
        sys.exit(1)
for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGCONT):
    signal.signal(s, on)
if mode == "dies-of-term":
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
note("ready " + " ".join(sys.argv[1:]))
if mode == "sigkill":
    os.kill(os.getpid(), signal.SIGKILL)
if mode.startswith("exit"):
    sys.exit(int(mode[4:]))
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
           "SCONTROL_LOG": str(tmp_path / "scontrol.log")}  # fmt: skip
    return script, env


def _notes(tmp_path: Path, name: str = "fake.log") -> list[str]:
    path = tmp_path / name
    return path.read_text().splitlines() if path.exists() else []


def _ours(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("supervise:")]


def _run(tmp_path: Path, shell: str, mode: str, signals: tuple[int, ...] = (), scontrol_rc: int = 0):
    script, env = _setup(tmp_path, scontrol_rc)
    proc = subprocess.Popen([shell, str(script)], env={**env, "FAKE_MODE": mode}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 30
    while not any(n.startswith("ready") for n in _notes(tmp_path)) and proc.poll() is None:
        assert time.monotonic() < deadline, "the fake supervisor never started"
        time.sleep(0.02)
    for signum in signals:  # as Slurm does: to the batch shell only (--signal=B:USR1, scancel --batch)
        time.sleep(0.2)
        proc.send_signal(signum)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, err, _notes(tmp_path), _notes(tmp_path, "scontrol.log")


@pytest.mark.parametrize("shell", SHELLS)
def test_a_supervisor_killed_by_sigkill_requeues_the_job(tmp_path, shell):
    code, err, notes, scontrol = _run(tmp_path, shell, "sigkill")
    assert scontrol == ["requeue 4242"]
    assert code == 0
    assert notes[0] == f"ready -m supervisor.cli run --campaign {tmp_path / 'camp'}"
    ours = _ours(err)  # (the shell itself may say "Killed" about its child too)
    assert len(ours) == 1 and ours[0].startswith(f"{DIED_MARK} 9 in job 4242 run 0") and "requeued the job" in ours[0]


@pytest.mark.parametrize("shell", SHELLS)
def test_a_failed_requeue_ends_the_job_failed_with_one_line(tmp_path, shell):
    code, err, _, scontrol = _run(tmp_path, shell, "sigkill", scontrol_rc=1)
    assert scontrol == ["requeue 4242"]
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
    assert notes[1:] == ["SIGTERM"] and code == 1 and scontrol == [] and err == ""


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
    assert notes[1:] == ["SIGCONT", "SIGUSR1"] and code == 3 and scontrol == []


@pytest.mark.parametrize("shell", SHELLS)
def test_a_supervisor_killed_after_usr1_is_still_requeued(tmp_path, shell):
    """USR1 does not end the job: a supervisor OOM-killed while it checkpoints before the time limit is requeued."""
    code, _, notes, scontrol = _run(tmp_path, shell, "killed-after-usr1", (signal.SIGUSR1,))
    assert notes[1:] == ["SIGUSR1"] and code == 0 and scontrol == ["requeue 4242"]


@pytest.mark.parametrize("shell", SHELLS)
def test_set_e_and_set_u_in_an_adopted_scripts_set_up_do_not_break_it(tmp_path, shell):
    """An adopted script's set-up lines run first; `set -eu` there must not end the shell at the first `wait`."""
    script, env = _setup(tmp_path)
    done = subprocess.run([shell, "-eu", str(script)], env={**env, "FAKE_MODE": "sigkill"}, capture_output=True,
                          text=True, timeout=30)  # fmt: skip
    assert done.returncode == 0 and _notes(tmp_path, "scontrol.log") == ["requeue 4242"]

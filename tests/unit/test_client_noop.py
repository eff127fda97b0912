"""Unsupervised programs must not notice the client: no files, no output, default answers, and
importing it pulls in nothing heavy (it runs inside every training rank)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "structlog", "psutil", "tenacity", "slurm", "numpy", "pynvml")


def _run(code: str, cwd: Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SUPERVISOR_")}
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60
    )


def test_import_is_light(tmp_path: Path) -> None:
    slot_dir = tmp_path / "slots"
    slot_dir.mkdir(mode=0o700)
    code = (
        "import sys, json\n"
        "from supervisor import client\n"
        "client.step(1, loss=0.5)\n"
        "with client.phase('checkpoint'):\n"
        "    pass\n"
        "client.should_stop()\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    unsupervised = _run(code, tmp_path)
    supervised = _run(code, tmp_path, {"SUPERVISOR_SLOT_DIR": str(slot_dir)})
    for proc in (unsupervised, supervised):
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout) == []
    assert (slot_dir / "rank-0.slot").exists()  # the supervised run really went through the slot


def test_unsupervised_calls_are_silent_no_ops(tmp_path: Path) -> None:
    code = (
        "import json\n"
        "from supervisor import client\n"
        "for i in range(1000):\n"
        "    client.step(i, loss=float('nan'))\n"
        "    client.step(i)\n"
        "with client.phase('checkpoint'):\n"
        "    pass\n"
        "client.phase('eval')\n"
        "print(json.dumps([client.should_checkpoint(), client.should_stop(), client.resume_from(),\n"
        "                  client.is_supervised()]))\n"
    )
    before = set(os.listdir("/dev/shm"))
    proc = _run(code, tmp_path)
    assert proc.returncode == 0 and proc.stderr == ""
    assert json.loads(proc.stdout) == [False, False, None, False]
    assert list(tmp_path.iterdir()) == []
    # Slot directories of Slurm jobs (supervisor-JOB-UID[-TOKEN]-NODE, made by node agents of other campaigns)
    # come and go on a shared machine while this runs; an unsupervised client has no job to name one after.
    new = set(os.listdir("/dev/shm")) - before
    assert not [n for n in new if not re.fullmatch(r"supervisor-\d+-\d+(-[\w.-]+)?", n)], new


def test_unsupervised_keeps_default_signal_handling(tmp_path: Path) -> None:
    code = (
        "import signal\n"
        "from supervisor import client\n"
        "client.step(0)\n"
        "print(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)\n"
    )
    proc = _run(code, tmp_path)
    assert proc.stdout.strip() == "True"


def test_resume_from_reports_the_supervisors_choice(tmp_path: Path) -> None:
    code = "from supervisor import client\nprint(repr(client.resume_from()))\n"
    assert _run(code, tmp_path).stdout.strip() == "None"
    assert _run(code, tmp_path, {"SUPERVISOR_RESUME_FROM": ""}).stdout.strip() == "None"
    got = _run(code, tmp_path, {"SUPERVISOR_RESUME_FROM": "/ckpt/step-00000040"}).stdout.strip()
    assert got == repr("/ckpt/step-00000040")


def test_unknown_phase_name_is_a_clear_error(tmp_path: Path) -> None:
    code = "from supervisor import client\nclient.phase('chekpoint')\n"
    proc = _run(code, tmp_path)
    assert proc.returncode == 1
    assert "unknown phase 'chekpoint'; use one of init, step, checkpoint" in proc.stderr

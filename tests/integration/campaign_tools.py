"""Helpers for tests that run supervised campaigns on the real local Slurm (submit, watch, inject faults)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.decisions.tasklog import strip_label

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "train_ddp.py"
sys.path.insert(0, str(REPO))  # the examples' read-only campaign views, shared with the demo and the benches
from examples.campaign_view import events, live_rank, wait_for  # noqa: E402

__all__ = ["Campaign", "cancel", "events", "launches", "live_rank", "rank_pid", "submit", "supervise", "wait_for"]


@dataclass
class Campaign:
    job_id: str
    root: Path
    ckpt: Path

    def events(self) -> list[dict[str, Any]]:
        return events(self.root)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events() if e["type"] == kind]

    def live(self) -> dict[str, Any]:
        try:
            return json.loads((self.root / "live.json").read_text())
        except (OSError, ValueError):
            return {}

    def report(self) -> dict[str, Any]:
        out = supervise("report", str(self.root), "--json")
        return json.loads(out.stdout)

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.root.glob("logs/**/*.log")))

    def ended(self) -> dict[str, Any] | None:
        ended = self.of_type("campaign_ended")
        return ended[-1] if ended else None


def supervise(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "supervisor.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # fmt: skip
    if check and proc.returncode != 0:
        raise AssertionError(f"supervise {' '.join(args)} failed ({proc.returncode}): {proc.stderr}")
    return proc


def submit(tmp_path: Path, *, steps: int, step_time: float = 0.3, ckpt_every: int = 10, nodes: int = 2,
           tasks_per_node: int = 1, sbatch: tuple[str, ...] = ("--time=10",), config: str = "",
           train: tuple[str, ...] = (), preflight: str = "enabled = false") -> Campaign:  # fmt: skip
    """Submit the example training under the supervisor; returns once Slurm accepted the job. ``preflight``: the
    ``[preflight]`` table (off by default here: the collective test costs each campaign seconds of torch start-up
    on the 2 shared cores; tests/integration/test_preflight_campaign.py runs it)."""
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    cfg = tmp_path / "supervise.toml"
    cfg.write_text(f'[preflight]\n{preflight}\n[run]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_grace_s = 20\n{config}')
    out = supervise(
        "submit", f"--nodes={nodes}", f"--ntasks-per-node={tasks_per_node}", *sbatch, "--campaign", str(root),
        "--config", str(cfg), "--", sys.executable, str(EXAMPLE), "--steps", str(steps), "--ckpt-dir", str(ckpt),
        "--ckpt-every", str(ckpt_every), "--step-time", str(step_time), "--seed", "3", *train,
    )  # fmt: skip
    job_id = out.stdout.split()[1]
    return Campaign(job_id, root, ckpt)


def rank_pid(campaign: Campaign, rank: int, min_step: int) -> int | None:
    """The pid of ``rank`` once it has reached ``min_step`` (from the live table)."""
    row = live_rank(campaign.root, rank, min_step)
    return int(row["pid"]) if row else None


def send(pid: int, sig: signal.Signals) -> None:
    os.kill(pid, sig)


def cancel(job_id: str) -> None:
    subprocess.run(["scancel", job_id], capture_output=True, timeout=30, check=False)


def launches(campaign: Campaign) -> list[dict[str, Any]]:
    return campaign.of_type("step_launched")


def step_lines(text: str) -> list[str]:
    """The program's ``step=N loss=X`` lines from a launch log (srun --label's ``N: `` prefix removed)."""
    return [line for line in map(strip_label, text.splitlines()) if line.startswith("step=")]


def job_state(job_id: str) -> tuple[str, int] | None:
    """(JobState, Restarts) from scontrol, or None once Slurm forgot the job."""
    out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        return None
    fields = dict(kv.split("=", 1) for kv in out.stdout.split() if "=" in kv)
    return fields.get("JobState", ""), int(fields.get("Restarts", "0"))

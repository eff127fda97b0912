"""Shared pieces of the fault matrix (tests/integration/test_fault_matrix_*.py): submit a user-style program
(programs/torchsave_train.py) under the supervisor, find its processes, and check one row's outcome: the class,
the blamed nodes, the action, and that the relaunch resumed from the newest checkpoint valid before the fault.

Each row records the time it measured (fault -> detection, fault -> first resumed step) in
``$MATRIX_TIMES`` (a JSON-lines file, when set) so README's fault table can quote them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from campaign_tools import Campaign, events, live_rank, supervise, wait_for

from supervisor.checkpoint.store import CheckpointStore
from supervisor.decisions.tasklog import strip_label

PROGRAM = Path(__file__).resolve().parent / "programs" / "torchsave_train.py"
START_TIMEOUT = 150.0  # job scheduled, agents up, ranks import torch and build the gloo group (2 shared cores)
RELAUNCH_TIMEOUT = 90.0  # a fault seen, the step killed, the relaunch started
__all__ = ["PROGRAM", "Row", "ranks_pids", "submit_program", "newest_valid", "agent_pids", "record_time", "mark_bad_node"]


def submit_program(tmp_path: Path, *args: str, steps: int = 60, ckpt_every: int = 10, step_time: float = 0.3,
                   nodes: int = 2, sbatch: tuple[str, ...] = ("--time=10",), config: str = "",
                   name: str = "campaign", ckpt: Path | None = None, program: Path = PROGRAM) -> Campaign:  # fmt: skip
    """``supervise submit`` the user-style program; the checkpoint directory is found from its --ckpt-dir flag
    (no [run] checkpoint_dir), as a user who never wrote a config gets it. The preflight is off (its collective
    test costs every campaign seconds of torch start-up; test_preflight_campaign.py runs it)."""
    root, ckpt = tmp_path / name, ckpt or tmp_path / f"{name}-ckpt"
    path = tmp_path / f"{name}.toml"
    path.write_text(f"[preflight]\nenabled = false\n{config}")
    cfg = ["--config", str(path)]
    out = supervise("submit", f"--nodes={nodes}", "--ntasks-per-node=1", *sbatch, "--campaign", str(root), *cfg,
                    "--", sys.executable, str(program), "--steps", str(steps), "--ckpt-dir", str(ckpt),
                    "--ckpt-every", str(ckpt_every), "--step-time", str(step_time), *args)  # fmt: skip
    return Campaign(out.stdout.split()[1], root, ckpt)


def mark_bad_node(camp: Campaign, index: int) -> str:
    """Name the ``index``-th node of the first run's allocation as the bad one (read by the program)."""
    nodes = wait_for("the first run's nodes", lambda: (camp.of_type("attempt_started") or [{}])[0].get("nodes"), 150)
    camp.ckpt.mkdir(parents=True, exist_ok=True)
    (camp.ckpt / "bad-node").write_text(nodes[index])
    return nodes[index]


def newest_valid(ckpt: Path) -> tuple[str, int] | None:
    """The newest checkpoint that passes full validation now (path, step), without moving anything."""
    best = CheckpointStore(ckpt).newest_valid(full=True, quarantine=False)
    return (str(best.path), int(best.step)) if best is not None and best.step is not None else None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_srun(pid: int) -> bool:
    """srun itself, called by name (``srun ...``) or by path: Slurm 24.11's client wrapper in the chroot execs
    ``/usr/bin/srun`` (docs/local-cluster.md)."""
    return _cmdline(pid).split(" ", 1)[0].rsplit("/", 1)[-1] == "srun"


def _pids_with(*needles: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            cmd = _cmdline(int(entry))
            if all(n in cmd for n in needles):
                out.append(int(entry))
    return out


def agent_pids(camp: Campaign) -> list[int]:
    """The node agents of the campaign (python -m supervisor.agent --campaign ROOT), not their srun."""
    return [p for p in _pids_with("supervisor.agent", str(camp.root)) if not _is_srun(p)]


def ranks_pids(camp: Campaign) -> list[int]:
    """The campaign's live training ranks (not srun)."""
    return [p for p in _pids_with(str(PROGRAM), str(camp.ckpt)) if not _is_srun(p)]


def supervisor_pid(camp: Campaign) -> int | None:
    found = _pids_with("supervisor.cli", "run", "--campaign", str(camp.root))
    return found[0] if found else None


def record_time(row: str, **seconds: float) -> None:
    target = os.environ.get("MATRIX_TIMES")
    line = json.dumps({"row": row, **{k: round(v, 1) for k, v in seconds.items()}})
    print(f"matrix time: {line}")
    if target:
        with open(target, "a") as f:
            f.write(line + "\n")


_RESUMED = re.compile(r"resumed from (\S+) at step (\d+)")


@dataclass
class Row:
    """One fault of a campaign: its interruption, the action taken, and the launch that followed."""

    camp: Campaign
    index: int  # the n-th interruption of the campaign (0-based)

    def interruption(self, timeout: float = RELAUNCH_TIMEOUT) -> dict[str, Any]:
        found = wait_for(f"interruption #{self.index + 1}",
                         lambda: self.camp.of_type("interruption")[self.index:] or None, timeout)  # fmt: skip
        return found[0]

    def actions(self) -> list[str]:
        """The kinds of the actions journaled after this interruption, up to the next one."""
        out, seen = [], -1
        for e in self.camp.events():
            if e["type"] == "interruption":
                seen += 1
            elif e["type"] == "action" and seen == self.index:
                out.append(e["kind"])
        return out

    def check(self, cls: str, blamed: list[str], action: str) -> dict[str, Any]:
        got = self.interruption()
        assert got["class"] == cls, f"row #{self.index + 1}: class {got['class']!r}, evidence {got['evidence']}"
        assert sorted(got["blamed_nodes"]) == sorted(blamed), \
            f"row #{self.index + 1}: blamed {got['blamed_nodes']}, evidence {got['evidence']}"  # fmt: skip
        wait_for(f"action {action!r} after interruption #{self.index + 1}",
                 lambda: action in self.actions(), 30)  # fmt: skip
        return got

    def relaunch(self, timeout: float = RELAUNCH_TIMEOUT) -> dict[str, Any]:
        """The step_launched event that followed this interruption in the journal. By journal order, not time: an
        interruption inferred for a dead supervisor's run carries that run's last event time, which can be the
        time of its own launch (killed before it journaled anything else)."""
        self.interruption()

        def after() -> dict[str, Any] | None:
            seen = -1
            for e in self.camp.events():
                if e["type"] == "interruption":
                    seen += 1
                elif e["type"] == "step_launched" and seen >= self.index:
                    return e
            return None

        return wait_for("the relaunch", after, timeout)

    def resumed_from(self, expected: tuple[str, int] | None, timeout: float = RELAUNCH_TIMEOUT) -> float:
        """The relaunch was told to resume from ``expected`` (the newest checkpoint valid before the fault) and
        the program printed that it did; returns when its first step after the resume was seen (unix time)."""
        launch = self.relaunch(timeout)
        want_path, want_step = expected if expected else (None, None)
        assert launch["resume_step"] == want_step, f"resumed at step {launch['resume_step']}, expected {want_step}"
        if want_path is not None:
            assert Path(launch["resume_from"]).name == Path(want_path).name, launch
        run = [e for e in self.camp.of_type("attempt_started") if e["t"] <= launch["t"]][-1]
        log = self.camp.root / "logs" / f"job{run['job_id']}-restart{run['restart']}" / f"train-{launch['launch']}.log"

        def first_step() -> float | None:
            if not log.exists():  # it appears when the launch's srun starts, just after step_launched is journaled
                return None
            text = log.read_text(errors="replace")
            lines = [strip_label(line) for line in text.splitlines()]
            steps = [int(line.split()[0][5:]) for line in lines if line.startswith("step=")]
            if not steps:
                return None
            if want_step is not None:
                m = _RESUMED.search(text)
                assert m and Path(m.group(1)).name == Path(want_path or "").name and int(m.group(2)) == want_step, \
                    f"the program did not resume from {want_path}: {text[-600:]}"  # fmt: skip
            assert steps[0] == (want_step or 0) + 1, f"first step {steps[0]} after resuming at {want_step}"
            return log.stat().st_mtime

        wait_for("the relaunch's first step", first_step, timeout)
        return time.time()


def step_of(camp: Campaign, rank: int, min_step: int, timeout: float = START_TIMEOUT) -> dict[str, Any]:
    """The live-table row of ``rank`` once it reached ``min_step`` (ranks without the client have no step:
    then once rank 0 printed ``step=min_step``)."""
    return wait_for(f"rank {rank} at step {min_step}", lambda: live_rank(camp.root, rank, min_step), timeout)


def printed_step(camp: Campaign, launch: int) -> int:
    """The last ``step=N`` rank 0 printed in launch ``launch`` of the current attempt (0 if none yet)."""
    logs = sorted(camp.root.glob(f"logs/*/train-{launch}.log"), key=lambda p: p.stat().st_mtime)
    if not logs:
        return 0
    steps = [int(line.split()[0][5:]) for line in map(strip_label, logs[-1].read_text(errors="replace").splitlines())
             if line.startswith("step=")]  # fmt: skip
    return steps[-1] if steps else 0


def wait_printed(camp: Campaign, launch: int, step: int, timeout: float = START_TIMEOUT) -> int:
    return wait_for(f"launch {launch} at step {step}",
                    lambda: (s := printed_step(camp, launch)) >= step and s, timeout, poll=0.2)  # fmt: skip


def rank_pid_on(camp: Campaign, rank: int) -> int:
    """The pid of ``rank`` from the live table (the agents see every rank, client or not)."""
    row = wait_for(f"rank {rank} in the live table", lambda: live_rank(camp.root, rank), 30)
    return int(row["pid"])


def journal(camp: Campaign, kind: str) -> list[dict[str, Any]]:
    return events(camp.root, kind)

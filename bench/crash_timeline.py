"""Where the seconds of a node-crash recovery go: one timeline per crash row of bench_recovery.py.

Marks, each in seconds after the crash (``t0``), from what the run leaves behind:
- the supervisor's journal: the victim's last summary (the verdict's time minus its ``silent_s``), the
  ``node_loss_verdict`` (with what confirmed it), the ``interruption``, the action (``restart_in_allocation`` or
  ``requeue``; the step kill follows it), the requeued run's ``attempt_started``, the next ``preflight`` and
  ``step_launched``;
- Slurm's view, sampled every ``SlurmStates.POLL_S`` from outside (``squeue`` for the job, ``sinfo`` for the
  crashed node): each change of state, e.g. RUNNING -> COMPLETING -> PENDING -> RUNNING and the node's
  NOT_RESPONDING / DOWN;
- the training program's own ``timings:`` line (examples/train_ddp.py ``--timings``): exec of the rank,
  interpreter at the script, torch imported, process group built, checkpoint restored, first step done.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

TIMINGS = re.compile(r"timings: ((?:\w+=[\d.]+ ?)+)")
PROGRAM = (("exec", "rank exec"), ("python", "python at script"), ("torch", "torch imported"),
           ("pg", "process group"), ("restored", "restored"), ("step", "first step"))  # fmt: skip


class SlurmStates:
    """Samples the job's state and the crashed node's state in a thread; ``changes`` lists (t, what, state)."""

    POLL_S = 0.5

    def __init__(self, run: Callable[..., Any], job: str, node: str) -> None:
        self.run, self.job, self.node = run, job, node
        self.changes: list[tuple[float, str, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="slurm-states", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        last: dict[str, str] = {}
        while not self._stop.is_set():
            for what, argv in (("job", ("squeue", "-h", "-j", self.job, "-o", "%T")),
                               ("node", ("sinfo", "-h", "-n", self.node, "-o", "%T"))):  # fmt: skip
                try:
                    state = self.run(*argv, check=False).stdout.strip() or "gone"
                except Exception:  # noqa: BLE001 - a sample missed under load is only a gap in the timeline
                    continue
                if last.get(what) != state:
                    last[what] = state
                    self.changes.append((time.time(), what, state))
            self._stop.wait(self.POLL_S)

    def stop(self) -> list[tuple[float, str, str]]:
        self._stop.set()
        self._thread.join(timeout=5)
        return self.changes


def program_timings(logs: Iterable[Path]) -> dict[str, float]:
    """The last ``timings:`` line of the given launch logs (srun's ``N: `` label allowed before it)."""
    found: dict[str, float] = {}
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for match in TIMINGS.finditer(text):
            found = {k: float(v) for k, v in (pair.split("=") for pair in match.group(1).split())}
    return found


def marks(t0: float, journal: list[dict[str, Any]], states: list[tuple[float, str, str]],
          program: dict[str, float]) -> list[tuple[float, str]]:  # fmt: skip
    """(seconds after the crash, label) for every mark found, in time order."""
    after = [e for e in journal if e["t"] >= t0]
    out: list[tuple[float, str]] = []
    verdict = next((e for e in after if e["type"] == "node_loss_verdict" and e["verdict"] == "lost"), None)
    if verdict is not None:
        out.append((verdict["t"] - verdict["silent_s"], "last summary of the node"))
        how = verdict.get("confirmed_by") or ""
        out.append((verdict["t"], f"verdict lost (timeout {verdict['timeout_s']:.1f} s, by {how}"
                                  f"{': ' + verdict['detail'] if verdict.get('detail') else ''})"))  # fmt: skip
    labels = {"interruption": "interruption classified", "attempt_started": "next Slurm run: supervisor started",
              "step_launched": "srun of the training started", "failsafe": "failsafe acted"}  # fmt: skip
    seen: set[str] = set()
    for e in after:
        kind = e["type"]
        if kind == "action" and e["kind"] in ("restart_in_allocation", "requeue") and "action" not in seen:
            seen.add("action")
            out.append((e["t"], f"decided: {e['kind']} (the broken step is killed next)"))
        elif kind == "preflight":
            ran = "skipped" if e.get("skipped") else f"ran {e['duration_s']:.1f} s"
            out.append((e["t"], f"preflight {ran}"))
        elif kind in labels and kind not in seen:
            seen.add(kind)
            out.append((e["t"], labels[kind]))
    out += [(t, f"{what} {state}") for t, what, state in states]
    out += [(program[key], label) for key, label in PROGRAM if key in program]
    return sorted((t - t0, label) for t, label in out)


def render(label: str, rows: list[tuple[float, str]]) -> str:
    lines = [f"   timeline ({label}), seconds after the crash:"]
    lines += [f"   {t:7.2f}  {what}" for t, what in rows]
    return "\n".join(lines)

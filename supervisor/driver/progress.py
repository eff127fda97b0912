"""The per-rank records the goodput ledger folds: progress and checkpoint stalls, journaled from the heartbeat table.

The ranks' clients publish their step and the time they spent in checkpoint phases (measured around the
``phase("checkpoint")`` block); the agents carry both; this turns what the table shows for one launch into
``step_progress`` and ``checkpoint_stall`` events (docs/decisions.md), few enough for a weeks-long journal:

- ``step_progress`` at the launch's first step (the end of its start-up), every ``PROGRESS_S`` while steps
  advance, with each checkpoint stall, and when the launch ends (``final``), for the slowest reporting rank; the
  first one also carries ``restore_s``, the longest state load (``phase("restore")``) among the ranks that marked
  one in this launch, which splits the start-up's time (decisions/recovery_timings.py);
- ``checkpoint_stall`` when a rank's checkpoint time grew: the largest growth among the ranks (the slowest rank
  holds the others at the next collective), at the step the phase ended.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.decisions import events as ev
from supervisor.driver.context import Context

PROGRESS_S = 30.0  # a progress record at most this often while steps advance (about 3,000 a day)
MS_WRAP = 2**32  # the client's checkpoint milliseconds are a u32


class ProgressLog:
    def __init__(self, ctx: Context, every_s: float = PROGRESS_S) -> None:
        self.record, self.clock, self.every_s = ctx.record, ctx.clock, every_s
        self.launched(0)

    def launched(self, launch: int, carried: Mapping[int, int] | None = None,
                 restored: Mapping[int, tuple[int, int]] | None = None) -> None:
        """A new launch: its ranks start from nothing (their pids are new). A warm restart's ``carried``: pid ->
        beats of each process that goes on into the new generation; such a rank still shows its last step of the
        old one (the same number its first new step may have), so it counts only once it stepped again.
        ``restored``: pid -> (restore ms, restores) of those processes now, before their new generation's load."""
        self.launch = launch
        self.carried: Mapping[int, int] = dict(carried or {})
        self.restored: Mapping[int, tuple[int, int]] = dict(restored or {})
        self.last_step: int | None = None
        self.last_written = float("-inf")
        self.ckpt_ms: dict[int, int] = {}  # pid -> checkpoint ms last seen

    def observe(self, live: Any, final: bool = False) -> None:
        """One look at the launch's ranks (``live``: the table's snapshot, earlier launches' ranks left out)."""
        now = self.clock()
        ranks = [r for r in live.ranks if r.beats > self.carried.get(r.pid, 0) and r.step is not None]
        grown: list[tuple[int, Any]] = []
        for r in ranks:
            before = self.ckpt_ms.get(r.pid)
            self.ckpt_ms[r.pid] = r.ckpt_ms
            delta = r.ckpt_ms if before is None else (r.ckpt_ms - before) % MS_WRAP
            if delta > 0:
                grown.append((delta, r))
        if grown:
            delta, r = max(grown, key=lambda x: x[0])
            step = max(x.ckpt_step for _, x in grown)
            end_t = now - (r.beat_age_s or 0.0)  # its last sign of life: the phase's end unless it stepped since
            self.record(ev.checkpoint_stall(now, self.launch, step, delta / 1000.0, end_t, len(grown)))
        if not ranks:
            return
        slow = min(ranks, key=lambda x: x.step)
        due = self.last_step is None or bool(grown) or now - self.last_written >= self.every_s
        if slow.step != self.last_step and (due or final):
            event = ev.step_progress(now, self.launch, slow.step, now - (slow.beat_age_s or 0.0), len(ranks))
            if self.last_step is None:
                restore_s = self.state_load_s(ranks)
                if restore_s is not None:
                    event["restore_s"] = restore_s
            self.record(event)
            self.last_step, self.last_written = slow.step, now

    def state_load_s(self, ranks: list[Any]) -> float | None:
        """The longest time a rank of this launch spent loading its state (client-measured restore phases, since
        the launch: a carried process's earlier generations' loads left out); None when no rank marked one."""
        loads = []
        for r in ranks:
            ms, count = self.restored.get(r.pid, (0, 0))
            if getattr(r, "restores", 0) != count:
                loads.append((r.restore_ms - ms) % MS_WRAP)
        return round(max(loads) / 1000.0, 3) if loads else None

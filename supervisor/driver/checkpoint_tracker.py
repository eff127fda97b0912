"""The driver's side of checkpoints: pick the one to resume from, notice new valid ones (the campaign's
progress), and quarantine those that may hold diverged weights after a NaN/Inf loss. Each change is journaled."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import structlog

from supervisor.decisions import events as ev
from supervisor.driver.context import Context

log = structlog.get_logger("supervisor")


class CheckpointTracker:
    def __init__(
        self, ctx: Context, checkpoint_dir: str | None, quarantined: Iterable[str] = (), best_step: int | None = None,
        *, key: bytes | None = None, adopt_foreign: bool = True, declared: Path | None = None,
    ) -> None:  # fmt: skip
        """``declared``: the campaign's ``checkpoint_dir.declared`` (``client.saves_to``), read while no
        directory is known."""
        self.checkpoint_dir = checkpoint_dir
        self.declared = declared
        self.key, self.adopt_foreign = key, adopt_foreign  # manifests signed by this campaign; foreign ones
        self.record, self.clock = ctx.record, ctx.clock
        self.quarantined: set[str] = set(quarantined)  # what earlier runs journaled is not journaled again
        self.best_step = best_step
        self.last_finite_loss_step: int | None = None  # the newest iteration seen with a finite loss

    def known(self) -> bool:
        """Whether the checkpoint directory is known (named by the command, the config, or the program)."""
        return bool(self.checkpoint_dir or self._adopt_declared())

    def _adopt_declared(self) -> str | None:
        """The directory the program declared, adopted (and journaled) the first time it is seen."""
        if self.checkpoint_dir or self.declared is None:
            return self.checkpoint_dir
        try:
            if not self.declared.is_file():
                return None
            text = self.declared.read_text(errors="replace")[:8192]
        except OSError:
            return None
        from supervisor.checkpoint.locate import parse_declaration

        found = parse_declaration(text)
        if found is not None:
            self.checkpoint_dir = found
            self.record(ev.checkpoint_dir_declared(self.clock(), found))
        return found

    def _store(self) -> Any:
        self._adopt_declared()
        if not self.checkpoint_dir or not Path(self.checkpoint_dir).is_dir():
            return None
        from supervisor.checkpoint.store import CheckpointStore

        return CheckpointStore(self.checkpoint_dir, key=self.key, adopt_foreign=self.adopt_foreign)

    def pick_resume(self) -> tuple[str | None, int | None]:
        """The newest valid checkpoint, fully validated (every shard's hash or CRC read: a bit flip in a shard
        passes the quick check), torn or corrupt ones quarantined on the way; or a fresh start."""
        store = self._store()
        if store is None:
            return None, None
        newest = store.newest_valid(full=True, quarantine=True)
        for info in store.refused:  # foreign checkpoints refused from a root others can write: say why, once
            if str(info.path) not in self.quarantined:
                self.quarantined.add(str(info.path))
                self.record(ev.checkpoint_refused(self.clock(), str(info.path), info.reason))
        for moved in store.quarantined():
            if str(moved.path) not in self.quarantined:
                self.quarantined.add(str(moved.path))
                self.record(ev.checkpoint_quarantined(self.clock(), str(moved.path), moved.reason))
        if newest is None:
            return None, None
        self._note(newest)
        return str(newest.path), newest.step

    def launched(self, resume_step: int | None) -> None:
        """A launch's losses start after the checkpoint it resumes from."""
        self.last_finite_loss_step = resume_step

    def saw_finite_loss(self, iteration: int) -> None:
        self.last_finite_loss_step = max(self.last_finite_loss_step or 0, iteration)

    def diverged_from(self, normal_step: int) -> None:
        """The loss spiked and never came back; ``normal_step`` is the last step seen with a normal loss. That loss
        was computed with the weights of the step before, so the last state known good is that one (the update at
        ``normal_step`` may be the bad one), however finite the later losses were."""
        self.last_finite_loss_step = min(self.last_finite_loss_step or 0, max(0, normal_step - 1))

    def quarantine_after_divergence(self) -> None:
        """After a NaN/Inf loss, checkpoints newer than the last iteration seen with a finite loss may hold the
        diverged weights: move them aside so no later run resumes from them (never deleted)."""
        store = self._store()
        if store is None:
            return
        since = self.last_finite_loss_step or 0
        for info in store.list():
            if info.step is not None and info.step > since and info.status in ("valid", "unverified"):
                reason = f"saved at step {info.step}, after the last good loss seen (step {since}) and before " \
                         "the divergence (a NaN/Inf loss, or a spike it never came back from) was detected: may hold " \
                         "diverged weights"  # fmt: skip
                moved = store.quarantine(info.path, reason)
                self.quarantined.add(str(moved))
                self.record(ev.checkpoint_quarantined(self.clock(), str(moved), reason))

    def _note(self, info: Any) -> None:
        """Journal a newly seen valid checkpoint: it is the campaign's progress (budgets, lost work)."""
        if info is None or info.step is None or (self.best_step is not None and info.step <= self.best_step):
            return
        self.best_step = info.step
        self.record(ev.checkpoint_committed(self.clock(), info.step, str(info.path)))

    def scan(self) -> None:
        store = self._store()
        if store is not None:
            try:
                self._note(store.newest_valid(full=False, quarantine=False))
            except OSError as err:
                log.warning("checkpoint_scan_failed", error=str(err))

"""Sample every rank slot of this node into wire entries.

WHY rescan the directory and compare inodes each round: a restarted rank reuses ``rank-N.slot`` (same
inode, new pid, which the record shows) but a cleaned-up and recreated directory gives new files; either
way the agent keeps following the rank without being restarted itself.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from supervisor.agent.procwatch import ProcWatch
from supervisor.client.slot import SlotReader, SlotRecord, open_slot_for_reading, slot_paths
from supervisor.heartbeat import wire


class RankSlots:
    def __init__(self, slot_dir: str | os.PathLike[str]) -> None:
        self.slot_dir = Path(slot_dir)
        self.readers: dict[int, tuple[SlotReader, int]] = {}  # rank -> (reader, inode)
        self.records: dict[int, SlotRecord] = {}
        self.procs = ProcWatch()
        self.slotless: dict[int, int] = {}  # rank -> pid of ranks that never call the client
        self.slotless_since: dict[int, float] = {}  # rank -> wall time its process was first found alive

    def scan(self) -> None:
        """Open new slot files, reopen replaced ones, drop vanished ones."""
        paths = slot_paths(self.slot_dir)
        for rank in [r for r in self.readers if r not in paths]:
            self._drop(rank)
        for rank, path in paths.items():
            try:
                inode = os.stat(path, follow_symlinks=False).st_ino
            except OSError:
                continue
            known = self.readers.get(rank)
            if known is not None and known[1] == inode:
                continue
            if known is not None:
                self._drop(rank)
            try:
                self.readers[rank] = (open_slot_for_reading(path), inode)
            except OSError:
                continue

    def _drop(self, rank: int) -> None:
        reader, _ = self.readers.pop(rank)
        self.records.pop(rank, None)
        reader.close()

    def adopt(self, ranks: dict[int, int]) -> None:
        """Ranks found without a slot (rank -> pid): watched through their process only."""
        now = time.time()
        seen = {r: self.slotless_since.get(r, now) for r, pid in ranks.items()
                if r not in self.readers and self.slotless.get(r) == pid}  # fmt: skip
        self.slotless = {r: pid for r, pid in ranks.items() if r not in self.readers}
        # when each was first found alive: a process that started later on that pid is another one
        self.slotless_since = {r: seen.get(r, now) for r in self.slotless}

    def sample(self, now_ns: int | None = None) -> list[wire.RankEntry]:
        """One entry per rank whose slot holds a valid record, plus the slot-less ranks, sorted by rank."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        out = []
        for rank in sorted(self.readers):
            reader = self.readers[rank][0]
            try:
                rec = reader.read()
                ctl = reader.read_control()
            except (OSError, ValueError):
                rec = ctl = None
            if rec is None:
                continue
            self.records[rank] = rec
            state, cpu = self.procs.sample(rec.pid, rec.start_wall_ns / 1e9)
            life = rec.last_sign_of_life_ns()
            out.append(wire.RankEntry(
                rank=rec.rank, pid=rec.pid, step=rec.step, phase=rec.phase, state=state,
                rank_flags=rec.rank_flags & 0xFFFF, control_flags=(ctl.flags if ctl else 0) & 0xFF,
                beat_age_ms=wire.NO_BEAT if life <= 0 else max(0, (now - life) // 1_000_000),
                ewma_s=rec.iter_ewma_ns / 1e9, min_s=rec.iter_min_ns / 1e9, max_s=rec.iter_max_ns / 1e9,
                loss=rec.loss, loss_step=rec.loss_step, beats=rec.beats, exit_code=wire.EXIT_UNKNOWN, exit_signal=0, cpu_s=cpu,
                ckpt_ms=rec.ckpt_ms, ckpt_step=rec.last_ckpt_step, own_s=rec.own_ewma_ns / 1e9,
                restore_ms=rec.restore_ms, restores=rec.restores,
            ))
        for rank, pid in sorted(self.slotless.items()):
            if rank in self.records:
                continue
            state, cpu = self.procs.sample(pid)
            out.append(wire.RankEntry(
                rank=rank, pid=pid, step=0, phase=0, state=state, rank_flags=0, control_flags=0,
                beat_age_ms=wire.NO_BEAT, ewma_s=0.0, min_s=0.0, max_s=0.0, loss=float("nan"), loss_step=-1,
                beats=0, exit_code=wire.EXIT_UNKNOWN, exit_signal=0, cpu_s=cpu,
            ))
        out.sort(key=lambda e: e.rank)
        self.procs.forget_except({r.pid for r in self.records.values()} | set(self.slotless.values()))
        return out

    def set_flags(self, rank: int, flags: int, at_step: int) -> bool:
        known = self.readers.get(rank)
        return known is not None and known[0].set_control_flags(flags, at_step)

    def close(self) -> None:
        for rank in list(self.readers):
            self._drop(rank)

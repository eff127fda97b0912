"""Ask for the stacks of ranks past their own phase's timeout, and name the one the others wait for.

Why: when the stuck rank beat for the same step as its peers (it hung after its beat, they wait for it in the
next collective), the heartbeats show everyone silent on one step, and a peer's longer allowance (a collective
checkpoint save it waits in) kept the stuck rank from being judged by its own timeout: the stall was seen only
at the most lenient allowance, as "all ranks silent", naming nobody. As soon as ranks pass their own timeout,
the probe asks their node agents for their stacks and those of a few peers (the client's faulthandler dump, or
py-spy; the agent picks), reads the dumps as they arrive, and the pure rule (``decisions/stall.py``) names the rank
that is not waiting while its peers wait. The watch then ends with ``rank_hang`` for that rank.

It only polls and acts: one probe per set of overdue ranks, answers read without blocking the loop (bounded by
``WAIT_S``); dumps that named somebody stay (the kill that follows saves and journals every rank's stack
again), dumps that named nobody are removed (a checkpoint that outlasts the step timeout would otherwise
leave a dump per rank each time); a dump path outside the campaign's ``stacks/`` directory is not read.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from supervisor.agent.stacks import FAULTHANDLER_TIMEOUT_S
from supervisor.decisions import stall
from supervisor.decisions.detect.findings import RANK_HANG, DetectionEvent, of_silence
from supervisor.decisions.detect.hang import Overdue
from supervisor.driver.context import Context
from supervisor.heartbeat import wire
from supervisor.paths import CampaignPaths

WAIT_S = FAULTHANDLER_TIMEOUT_S + 2.0  # the clients' own dumps; py-spy's (slower) are read if they came by then
MAX_CANDIDATES = 64  # more ranks past their timeout than this is not one odd rank: the global stall covers it
PEERS = 16  # peers (not past their timeout) asked too: someone must be seen waiting


@dataclass
class _Probe:
    candidates: dict[int, Overdue]
    asked: dict[int, str]  # rank -> node
    deadline: float
    got: dict[int, stall.Stack | None] = field(default_factory=dict)
    paths: list[Path] = field(default_factory=list)


class StallProbe:
    def __init__(self, ctx: Context, channel: Any, campaign: Path, wait_s: float = WAIT_S) -> None:
        self.ctx, self.channel, self.wait_s = ctx, channel, wait_s
        self.stacks_dir = CampaignPaths(campaign).stacks.resolve()  # where the agents save the dumps
        self.probe: _Probe | None = None
        self.tried: set[frozenset[tuple[int, int | None]]] = set()  # (rank, step) sets already probed

    def reset(self) -> None:
        """A new launch."""
        self.probe, self.tried = None, set()

    @property
    def pending(self) -> bool:
        return self.probe is not None

    def update(self, overdue: Mapping[int, Overdue], live_ranks: Sequence[tuple[int, str]]) -> DetectionEvent | None:
        """Called each watch pass with the ranks past their own timeout and the launch's live (rank, node)s. A
        ``rank_hang`` naming the rank the others wait for, once its stacks show it; else None."""
        if self.probe is None:
            self._start(overdue, live_ranks)
            return None
        self._collect()
        p = self.probe
        if len(p.got) < len(p.asked) and time.monotonic() < p.deadline:
            return None
        self.probe = None
        verdict = stall.odd_ranks(p.candidates, {r: p.got.get(r) for r in p.asked})
        if verdict.named and not set(verdict.named) <= set(overdue):
            verdict = stall.StallVerdict((), ())  # a named rank has beaten since: it was slow, not stuck
        if not verdict.named:
            self._remove(p.paths)
            return None
        named = [p.candidates[r] for r in verdict.named]
        worst = max(named, key=lambda o: o.age_s)
        return of_silence(RANK_HANG, verdict.named, (o.node for o in named), "beat_age_s", worst.age_s,
                          worst.own_limit_s, *(f"{line}" for line in verdict.evidence),
                          *(f"rank {r} on {p.candidates[r].node} silent {p.candidates[r].age_s:.1f}s > its own "
                            f"{p.candidates[r].phase} timeout {p.candidates[r].own_limit_s:.1f}s (step "
                            f"{p.candidates[r].step})" for r in verdict.named[:16]))  # fmt: skip

    def _start(self, overdue: Mapping[int, Overdue], live_ranks: Sequence[tuple[int, str]]) -> None:
        if not overdue or len(overdue) > MAX_CANDIDATES:
            return
        key = frozenset((r, o.step) for r, o in overdue.items())
        if key in self.tried:
            return
        self.tried.add(key)
        asked = {r: o.node for r, o in overdue.items()}
        for rank, node in live_ranks:
            if len(asked) >= len(overdue) + PEERS:
                break
            asked.setdefault(rank, node)
        by_node: dict[str, list[int]] = {}
        for rank, node in asked.items():
            by_node.setdefault(node, []).append(rank)
        for node, ranks in by_node.items():
            self.channel.send(node, [wire.Command(wire.CMD_DUMP_STACKS, r) for r in ranks])
        self.probe = _Probe(dict(overdue), asked, time.monotonic() + self.wait_s)

    def _collect(self) -> None:
        """Take the stack answers of the asked ranks off the channel's event queue (other events stay)."""
        p = self.probe
        assert p is not None
        events = self.channel.table.events
        for _ in range(len(events)):
            item = events.popleft()
            rank = item.get("rank")
            if item.get("event") not in ("stacks_saved", "stacks_failed") or rank not in p.asked or \
                    item.get("node") != p.asked[rank]:  # fmt: skip
                events.append(item)
                continue
            if item["event"] == "stacks_failed":
                p.got[rank] = None
                continue
            path = self._inside(str(item.get("text") or ""))
            p.got[rank] = None if path is None else self._read(path)
            if path is not None:
                p.paths.append(path)

    def _inside(self, text: str) -> Path | None:
        """The dump's path when it lies in the campaign's stacks directory (the agent's answer names it)."""
        try:
            path = Path(text).resolve()
        except (OSError, RuntimeError, ValueError):
            return None
        return path if path.parent == self.stacks_dir else None

    @staticmethod
    def _read(path: Path) -> stall.Stack | None:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                return stall.parse(f.read(stall.MAX_TEXT).decode(errors="replace"))
        except OSError:
            return None

    @staticmethod
    def _remove(paths: Sequence[Path]) -> None:
        for path in paths:
            try:
                path.unlink()
            except OSError:
                pass

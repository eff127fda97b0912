"""The checkpoint interval, asked of the ranks: ``[run] checkpoint_interval = "auto" | seconds | "off"``.

Under ``"auto"`` the interval is Daly's, from the checkpoint stall the clients measured (``checkpoint_stall``
events), the restart cost and this campaign's interruption rate, else the configured or site prior MTBF
(``decisions.checkpoint_interval.advise_measured`` on the campaign state's measured inputs, recomputed every
``ADVICE_S``); before any stall was
measured, a first checkpoint is asked ``FIRST_ASK_S`` after the launch's first step, to measure it. When that much time has
passed since the launch's last checkpoint (or its first step), every rank is asked through the checkpoint-request
path (``CheckpointRequest``: the slot's FLAG_CHECKPOINT with a new request number), so ``client.should_checkpoint()``
answers True until its ``phase("checkpoint")`` block completes. The advice is journaled (``checkpoint_interval``)
when it changes, so ``report`` and ``status`` show the interval in force, its inputs and the predicted goodput.
"""

from __future__ import annotations

from typing import Any

from supervisor.decisions import checkpoint_interval as ci
from supervisor.decisions import events as ev
from supervisor.decisions.campaign_state import CampaignState
from supervisor.driver.checkpoint_request import CheckpointRequest
from supervisor.driver.context import Context

ADVICE_S = 60.0  # the advice is recomputed this often
CHANGE = 0.05  # a new interval is journaled when it moved by more than this fraction (or its inputs' source)


class IntervalAsker:
    def __init__(self, ctx: Context, setting: str | float, *, prior_mtbf_s: float | None, nodes: int,
                 state: CampaignState, channel: Any, flag: int) -> None:  # fmt: skip
        self.setting = ci.parse_setting(setting)
        self.prior_mtbf_s, self.nodes = prior_mtbf_s or None, nodes
        self.record, self.clock = ctx.record, ctx.clock
        self.state, self.channel, self.flag = state, channel, flag
        self.advice: ci.Advice | None = None
        self.next_advice = float("-inf")
        self.launched()

    def launched(self) -> None:
        self.anchor: float | None = None  # the last checkpoint's end (or the first step) of this launch
        self.seen_ms: dict[int, int] = {}  # pid -> checkpoint ms: a growth is a checkpoint that happened
        self.request: CheckpointRequest | None = None
        self.ranks: list[Any] = []

    def advise(self, now: float) -> ci.Advice:
        if self.advice is None or now >= self.next_advice:
            self.next_advice = now + ADVICE_S
            advice = ci.advise_measured(self.setting, self.state.interval.measured(now), self.nodes, self.prior_mtbf_s)
            if _changed(self.advice, advice):
                self.record(ev.checkpoint_interval(now, str(self.setting), advice.to_dict()))
            self.advice = advice
        return self.advice

    def observe(self, live: Any) -> None:
        """One pass over the launch's ranks: note checkpoints, and ask for one when it is due."""
        if self.setting == ci.OFF:
            return
        now = self.clock()
        self.ranks = [r for r in live.ranks if r.beats > 0]
        if not self.ranks:
            return
        grew = False
        for r in self.ranks:
            before = self.seen_ms.get(r.pid)
            self.seen_ms[r.pid] = r.ckpt_ms
            grew = grew or (before is not None and r.ckpt_ms != before)
        if self.anchor is None or grew:
            self.anchor, self.request = now, None  # a checkpoint answered the request (or the program's own)
        advice = self.advise(now)
        if self.request is None and ci.due(advice, now - self.anchor):
            self.request = CheckpointRequest(self.channel, lambda: self.ranks, self.flag)
            step = min(r.step for r in self.ranks)
            first = advice.mode == "auto" and advice.delta_s is None
            why = "auto: a first checkpoint, to measure the stall" if first else advice.mode
            self.record(ev.checkpoint_requested(now, f"interval {advice.interval_s:.0f} s ({why})", step))
        if self.request is not None:
            self.request.deliver()


def _changed(old: ci.Advice | None, new: ci.Advice) -> bool:
    if old is None or old.mtbf_source != new.mtbf_source or (old.interval_s is None) != (new.interval_s is None):
        return True
    if (old.delta_s is None) != (new.delta_s is None):  # the first stall measured: the advice's basis changed
        return True
    if old.interval_s is None or new.interval_s is None:
        return False
    return abs(new.interval_s - old.interval_s) > CHANGE * old.interval_s

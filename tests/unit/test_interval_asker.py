"""``[run] checkpoint_interval``: the supervisor asks the ranks for a checkpoint when the interval is due, through the
checkpoint-request path, journals the interval in force, and ``report``/``status`` show it (issue 13 item 2)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from fakes import FakeChannel, Launch, rank_view
from test_driver import JOB, make, run

from supervisor.client import slot
from supervisor.commands.status import summary_line
from supervisor.config import from_mapping
from supervisor.decisions import campaign_state
from supervisor.decisions import checkpoint_interval as ci
from supervisor.decisions import events as ev
from supervisor.driver.context import Context
from supervisor.driver.interval import IntervalAsker
from supervisor.heartbeat import wire
from supervisor.report_view import fold, render_text


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def asker(setting: Any, history: list[dict], now: list[float], channel: FakeChannel, **kw: Any) -> IntervalAsker:
    """``history``: the journal so far; what the asker records is appended to it and applied to the state it
    reads (as the loop's recorder does)."""
    state = campaign_state.fold(history)

    def record(event: dict) -> None:
        history.append(event)
        state.apply(event)

    return IntervalAsker(Context.of(record, lambda: now[0]), setting, prior_mtbf_s=kw.get("prior"),
                         nodes=kw.get("nodes", 2048), state=state, channel=channel, flag=slot.FLAG_CHECKPOINT)


def flag_sends(channel: FakeChannel) -> list[tuple[str, int, int]]:
    return [(node, c.rank, c.arg) for node, cmds in channel.sent for c in cmds if c.command == wire.CMD_SET_FLAGS]


def live(ckpt_ms: int = 0, step: int = 10) -> Any:
    return SimpleNamespace(ranks=[rank_view("n1", 0, 11, ckpt_ms=ckpt_ms, step=step),
                                  rank_view("n2", 1, 12, ckpt_ms=ckpt_ms, step=step)])


def test_auto_asks_at_dalys_interval_from_the_measured_stall_and_the_site_prior() -> None:
    history: list[dict] = [ev.checkpoint_stall(0.0, 1, 5, 1.0, 0.0, 2), ev.checkpoint_stall(1.0, 1, 9, 1.0, 1.0, 2)]
    now, channel = [100.0], FakeChannel(JOB)
    a = asker("auto", history, now, channel)
    a.observe(live())  # the first step: the interval counts from here
    advice = history[-1]
    assert advice["type"] == ev.CHECKPOINT_INTERVAL and advice["mode"] == "auto" and advice["delta_s"] == 1.0
    assert advice["mtbf_source"] == "site prior"
    expected = ci.daly_interval(1.0, ci.site_prior_mtbf_s(2048))
    assert advice["interval_s"] == pytest.approx(expected, abs=1e-3)
    assert flag_sends(channel) == []
    now[0] = 100.0 + expected - 1
    a.observe(live())
    assert flag_sends(channel) == []  # not due yet
    now[0] = 100.0 + expected + 0.5
    a.observe(live())
    assert sorted((n, r) for n, r, _ in flag_sends(channel)) == [("n1", 0), ("n2", 1)]
    assert all(wire.split_flags_arg(arg)[0] == slot.FLAG_CHECKPOINT for _, _, arg in flag_sends(channel))
    assert history[-1]["type"] == ev.CHECKPOINT_REQUESTED and history[-1]["reason"].startswith("interval")
    # the ranks checkpoint (their checkpoint time grows): the clock restarts, no second request until due again
    now[0] += 5
    a.observe(live(ckpt_ms=900))
    sends = len(flag_sends(channel))
    now[0] += expected - 1
    a.observe(live(ckpt_ms=900))
    assert len(flag_sends(channel)) == sends
    now[0] += 2
    a.observe(live(ckpt_ms=900))
    assert len(flag_sends(channel)) == sends + 2


def test_auto_asks_a_first_checkpoint_early_to_measure_the_stall_and_off_never_asks() -> None:
    """Before any stall was measured, "auto" asks one checkpoint FIRST_ASK_S after the launch's first step (a
    program that leaves checkpoints to "auto" would otherwise never save); once the ranks' checkpoint time
    grew and the loop journaled the stall, Daly's interval from it takes over."""
    history: list[dict] = []
    now, channel = [1000.0], FakeChannel(JOB)
    a = asker("auto", history, now, channel)
    a.observe(live())  # the first step
    first = history[-1]
    assert first["type"] == ev.CHECKPOINT_INTERVAL and first["interval_s"] == ci.FIRST_ASK_S
    assert first["delta_s"] is None and flag_sends(channel) == []
    text = render_text(fold(history, now=now[0]))
    assert "checkpoint interval: 300 s after the first step (auto: a first checkpoint, to measure the stall" in text
    now[0] = 1000.0 + ci.FIRST_ASK_S - 1
    a.observe(live())
    assert flag_sends(channel) == []
    now[0] = 1000.0 + ci.FIRST_ASK_S
    a.observe(live())
    assert sorted((n, r) for n, r, _ in flag_sends(channel)) == [("n1", 0), ("n2", 1)]
    assert history[-1]["type"] == ev.CHECKPOINT_REQUESTED and "to measure the stall" in history[-1]["reason"]
    # the ranks save (their checkpoint time grows) and the loop journals the measured stall: the advice that
    # follows is Daly's for it, journaled although the interval may not have moved by 5 %
    now[0] += 3
    a.observe(live(ckpt_ms=2000))
    a.record(ev.checkpoint_stall(now[0], 1, 10, 2.0, now[0], 2))  # journaled by the loop (its recorder)
    sends = len(flag_sends(channel))
    now[0] += 61  # the advice is recomputed every minute
    a.observe(live(ckpt_ms=2000))
    advice = [e for e in history if e["type"] == ev.CHECKPOINT_INTERVAL][-1]
    assert advice["delta_s"] == 2.0 and advice["interval_s"] == pytest.approx(
        ci.daly_interval(2.0, ci.site_prior_mtbf_s(2048)), abs=1e-3)
    assert len(flag_sends(channel)) == sends  # not due: the clock restarted at the checkpoint
    off = asker("off", history, now, channel)
    off.observe(live())
    now[0] += 1e6
    off.observe(live())
    assert len(flag_sends(channel)) == sends
    # a journal from before this rule (auto, no interval) still reads
    assert "waiting for a measured checkpoint stall" in render_text(fold(
        [ev.checkpoint_interval(0.0, "auto", {"interval_s": None, "mode": "auto"})], now=0.0))


def test_a_fixed_interval_and_the_observed_mtbf() -> None:
    history: list[dict] = [ev.checkpoint_stall(0.0, 1, 5, 2.0, 0.0, 2)]
    for k in range(4):  # four interruptions in 4 hours of running: M = 1 h
        history += [ev.step_launched(k * 3600.0, k + 1, ["n1"]), ev.interruption_event(k * 3600.0 + 3600, "hang",
                                                                                          [], 0.9, [])]  # fmt: skip
    history.append(ev.step_launched(4 * 3600.0, 5, ["n1"]))
    now, channel = [4 * 3600.0], FakeChannel(JOB)
    a = asker("auto", history, now, channel, prior=99_999.0)
    a.observe(live())
    assert history[-1]["mtbf_source"] == "observed" and history[-1]["mtbf_s"] == pytest.approx(3600.0)
    fixed = asker(600, history, now, channel)
    fixed.observe(live())
    assert history[-1]["mode"] == "fixed" and history[-1]["interval_s"] == 600.0
    doc = fold(history, now=now[0])
    assert doc["checkpoint_interval"]["interval_s"] == 600.0
    line = summary_line({"state": "running", "attempts": 5, "checkpoint_interval": doc["checkpoint_interval"]})
    assert "checkpoint interval: 600 s (fixed; stall 2.00 s" in line and "predicted goodput" in line


def test_the_loop_asks_the_ranks_and_journals_progress(tmp_path: Path) -> None:
    """The driver with a fixed 1 s interval: the ranks (fakes: they stop when asked) get the request; the
    journal has the goodput ledger's records and the interval in force."""
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(None, stops_on_flags=True)])
    sup.config = from_mapping({"run": {"checkpoint_interval": 1}})
    r = run(sup, slurm, launcher, channel)
    kinds = [e["type"] for e in r.events]
    assert ev.STEP_PROGRESS in kinds and ev.CHECKPOINT_INTERVAL in kinds
    requested = r.of(ev.CHECKPOINT_REQUESTED)
    assert requested and requested[0]["reason"].startswith("interval 1 s (fixed)")
    assert kinds.index(ev.STEP_PROGRESS) < kinds.index(ev.INTERRUPTION)

"""The time limit when Slurm's USR1 never reached the supervisor (supervisor/driver/time_limit_watch.py): its own
clock, confirmed with Slurm, stands in for the warning; the classifier calls that a timeout, nobody blamed; the
loop (on the driver fakes) asks the ranks to checkpoint and requeues, as after a USR1."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Launch
from test_driver import make, run

from supervisor.decisions import events as ev
from supervisor.decisions.classify import Evidence, classify
from supervisor.driver.time_limit_watch import WARNING_MARGIN_S, TimeLimitClock, warning_due


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize(("now", "end", "due"), [
    (0.0, None, False),  # no time limit
    (0.0, 1000.0, False),
    (1000.0 - 120 + WARNING_MARGIN_S - 0.1, 1000.0, False),  # Slurm's own USR1 still has its moment
    (1000.0 - 120 + WARNING_MARGIN_S, 1000.0, True),
    (2000.0, 1000.0, True),
])  # fmt: skip
def test_warning_due(now: float, end: float | None, due: bool) -> None:
    assert warning_due(now, end, 120.0) is due


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_it_fires_once_and_only_when_slurm_confirms_the_end() -> None:
    clock = Clock(0.0)
    answer: list[tuple[bool, float | None]] = [(True, 2000.0)]
    read = []

    def confirmed() -> tuple[bool, float | None]:
        read.append(clock.t)
        return answer[0]

    tl = TimeLimitClock(lambda: 1000.0, confirmed, 120.0, clock)
    assert not tl.due() and read == []  # far from the end: Slurm's answer is not even looked at
    clock.t = 900.0
    assert not tl.due()  # Slurm says the limit was extended to 2000
    answer[0] = (False, None)
    clock.t = 904.0
    assert not tl.due()  # Slurm has not answered: nothing decided
    answer[0] = (True, 1000.0)
    clock.t = 908.0
    assert tl.due() and tl.fired_at == 908.0  # confirmed
    clock.t = 950.0
    assert not tl.due() and read == [900.0, 904.0, 908.0]  # once per Slurm run


def test_the_classifier_calls_it_a_timeout_and_blames_nobody() -> None:
    got = classify(Evidence(end_time=1000.0, scheduled_end=1000.0, time_limit_near=890.0, signal_lead_s=120))
    assert got.cls == ev.TIMEOUT and got.blamed_nodes == ()
    assert any("110 s away and Slurm's warning (USR1) never reached the supervisor" in e for e in got.evidence)
    preempted = classify(Evidence(end_time=1000.0, preempt_time=880.0, time_limit_near=890.0))
    assert preempted.cls == ev.PREEMPTION


def test_without_usr1_the_loop_checkpoints_and_requeues_before_the_time_limit(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(None)])
    slurm.set_job(end_time=int(time.time()) + 60)  # closer than the 120 s lead: the warning is overdue
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0
    assert r.classes() == [ev.TIMEOUT]
    interruption = r.of(ev.INTERRUPTION)[0]
    assert interruption["blamed_nodes"] == []
    assert any("never reached the supervisor" in line for line in interruption["evidence"])
    assert r.of(ev.CHECKPOINT_REQUESTED)  # the ranks were asked to save first
    assert ("requeue", "7") in slurm.calls


def test_far_from_the_time_limit_nothing_happens(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, ranks={"state": "exited", "exit_code": 0}, polls=8)])
    r = run(sup, slurm, launcher, channel)  # make()'s job ends in an hour
    assert r.classes() == [ev.COMPLETED] and ("requeue", "7") not in r.slurm.calls


def test_it_asks_slurm_afresh_once_the_warning_is_due_and_again_after_an_extension() -> None:
    """The background query is slow when the job cannot be preempted (every 5 minutes): an answer older than the
    moment the warning came due could miss a limit an admin extended meanwhile, so the clock asks for a fresh one."""
    clock = Clock(0.0)
    refreshed: list[float] = []
    answer: list[tuple[bool, float | None]] = [(True, 1000.0)]
    tl = TimeLimitClock(lambda: schedule[0], lambda: answer[0], 120.0, clock, refresh=lambda: refreshed.append(clock.t))
    schedule = [1000.0]
    assert not tl.due() and refreshed == []  # far from the end: no query asked for
    clock.t = 890.0
    answer[0] = (False, None)  # asked, not answered yet
    assert not tl.due() and refreshed == [890.0]
    clock.t = 891.0
    answer[0] = (True, 2000.0)  # the fresh answer: extended
    assert not tl.due() and refreshed == [890.0]
    schedule[0] = 2000.0  # (JobDeadline keeps the extended end)
    clock.t = 1890.0
    answer[0] = (True, 2000.0)
    assert tl.due() and refreshed == [890.0, 1890.0]  # asked again when the new end came near

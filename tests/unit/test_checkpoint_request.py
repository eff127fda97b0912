"""A checkpoint request reaches every rank of the launch, including ranks that start after it was made (Slurm's
USR1 right after a launch), its completion is awaited, and a missed one is journaled (issue 9 item 7)."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeChannel, rank_view
from test_driver import JOB, make, run

from supervisor.client import slot
from supervisor.config import from_mapping
from supervisor.decisions import events as ev
from supervisor.driver import checkpoint_request as cr
from supervisor.driver.checkpoint_tracker import CheckpointTracker
from supervisor.heartbeat import wire

WANTED = slot.FLAG_CHECKPOINT | slot.FLAG_STOP


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def flag_sends(channel: FakeChannel) -> list[tuple[str, int]]:
    return [(node, c.rank) for node, cmds in channel.sent for c in cmds if c.command == wire.CMD_SET_FLAGS]


def test_ranks_that_appear_after_the_request_get_it_by_name() -> None:
    channel = FakeChannel(JOB)
    ranks: list[Any] = []
    request = cr.CheckpointRequest(channel, lambda: ranks, WANTED)
    request.deliver()
    assert flag_sends(channel) == []  # nobody to tell yet: no broadcast into slots that do not exist
    ranks[:] = [rank_view("n1", 0, 11), rank_view("n2", 1, 12)]
    request.deliver()
    assert sorted(flag_sends(channel)) == [("n1", 0), ("n2", 1)]
    request.deliver()
    assert len(flag_sends(channel)) == 2  # not again within RESEND_S


def test_a_rank_whose_flags_do_not_show_the_request_gets_it_again_until_the_limit(monkeypatch) -> None:
    monkeypatch.setattr(cr, "RESEND_S", 0.0)
    channel = FakeChannel(JOB)
    ranks = [rank_view("n1", 0, 11), rank_view("n2", 1, 12)]
    request = cr.CheckpointRequest(channel, lambda: ranks, WANTED)
    request.deliver()
    ranks[0] = rank_view("n1", 0, 11, control_flags=WANTED)  # rank 0's agent applied it; rank 1's datagram lost
    for _ in range(10):
        request.deliver()
    sends = flag_sends(channel)
    assert sends.count(("n1", 0)) == 1 and sends.count(("n2", 1)) == cr.MAX_SENDS
    assert request.unreached() == [1]


def test_a_new_process_of_a_rank_gets_the_request_even_if_its_old_slot_showed_it() -> None:
    channel = FakeChannel(JOB)
    ranks = [rank_view("n1", 0, 11, control_flags=WANTED)]  # flags left in a reused slot by an earlier request
    request = cr.CheckpointRequest(channel, lambda: ranks, WANTED)
    request.deliver()
    assert flag_sends(channel) == [("n1", 0)]


class LateRanksChannel(FakeChannel):
    """The ranks of a launch show up in the table only after a few polls (slow start on a loaded machine)."""

    def __init__(self, job: str, delay_polls: int) -> None:
        super().__init__(job)
        self.delay_polls, self.polls = delay_polls, 0
        self.hidden: list[Any] = []

    def poll(self, timeout: float) -> int:
        self.polls += 1
        if self.hidden and self.polls >= self.delay_polls:
            self.table.ranks, self.hidden = self.hidden, []
        return super().poll(timeout)


def test_a_time_limit_right_after_the_launch_still_reaches_ranks_that_start_later(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, inbox = make(tmp_path, [])
    late = LateRanksChannel(JOB, delay_polls=30)
    from fakes import FakeLauncher, FakeSlurm, Launch

    launcher = FakeLauncher(late, ("n1", "n2"), 1, [Launch(None)])
    slurm = FakeSlurm(slurm.job_info, ("n1", "n2"), late)  # type: ignore[arg-type]
    slurm.set_job(end_time=int(time.time()) + 120)
    sup.slurm, sup.start_step = slurm, launcher  # type: ignore[assignment]
    sup.channel_factory = lambda root, job, bind, allowed: late  # type: ignore[assignment]
    real_start = launcher.__call__

    def start_hidden(argv: Any, env: Any, log_path: Path, cwd: str | None = None) -> Any:
        proc = real_start(argv, env, log_path, cwd)
        if "supervisor.agent" not in argv:
            late.hidden, late.table.ranks, late.polls = late.table.ranks, [], 0
        return proc

    sup.start_step = start_hidden  # type: ignore[assignment]
    inbox.deliver_after(1, "SIGUSR1")  # at once: before any rank has a slot
    r = run(sup, slurm, launcher, late)
    assert r.classes() == [ev.TIMEOUT]
    assert sorted(flag_sends(late)) == [("n1", 0), ("n2", 1)]  # by name, once they appeared
    assert late.current is not None and late.current.stop_requested and late.current.returncode == 0  # saved, stopped
    assert ("requeue", JOB) in slurm.calls


def test_a_requested_checkpoint_that_never_commits_is_journaled(tmp_path: Path) -> None:
    from fakes import Launch

    (tmp_path / "ckpt").mkdir()
    sup, slurm, launcher, channel, inbox = make(tmp_path, [Launch(None)])
    sup.config = from_mapping({"run": {"checkpoint_dir": str(tmp_path / "ckpt")}})
    slurm.set_job(end_time=int(time.time()) + 120)
    inbox.deliver_after(3, "SIGUSR1")
    r = run(sup, slurm, launcher, channel)
    missed = r.of(ev.CHECKPOINT_MISSED)
    assert len(missed) == 1 and missed[0]["reason"].startswith("the launch ended without committing")
    assert r.events.index(missed[0]) < r.events.index(r.of(ev.ATTEMPT_ENDED)[0])


def test_a_requested_checkpoint_that_commits_is_not_reported_missed(tmp_path: Path, monkeypatch) -> None:
    from fakes import Launch

    (tmp_path / "ckpt").mkdir()
    sup, slurm, launcher, channel, inbox = make(tmp_path, [Launch(None)])
    sup.config = from_mapping({"run": {"checkpoint_dir": str(tmp_path / "ckpt")}})
    slurm.set_job(end_time=int(time.time()) + 120)
    inbox.deliver_after(3, "SIGUSR1")

    def scan(self: CheckpointTracker) -> None:  # the ranks' save, seen once they were asked
        if channel.current is not None and channel.current.stop_requested:
            self.best_step = 42

    monkeypatch.setattr(CheckpointTracker, "scan", scan)
    r = run(sup, slurm, launcher, channel)
    assert r.of(ev.CHECKPOINT_REQUESTED) and not r.of(ev.CHECKPOINT_MISSED)

"""The batch step's signal inbox (supervisor/driver/signals.py): it records what Slurm sends for the loop, and
once closed a late USR1 (a warning: time limit near, preemption) is ignored instead of killing the supervisor."""

from __future__ import annotations

import os
import signal
import time

import pytest


@pytest.fixture()
def restore_signals():
    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in saved.items():
        signal.signal(s, h)


def test_signals_are_recorded_and_wake_the_wait(restore_signals):
    from supervisor.driver.signals import SignalInbox

    inbox = SignalInbox()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        t0 = time.monotonic()
        inbox.wait(5.0)
        assert time.monotonic() - t0 < 2.0
        got = inbox.drain()
        assert [r.name for r in got] == ["SIGUSR1"] and inbox.drain() == []
    finally:
        inbox.close()


def test_after_close_usr1_is_ignored_and_term_gets_its_old_handler_back(restore_signals):
    from supervisor.driver.signals import SignalInbox

    signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # as a supervisor started by hand has it
    before_term = signal.getsignal(signal.SIGTERM)
    SignalInbox().close()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) == before_term
    os.kill(os.getpid(), signal.SIGUSR1)  # would end this test process under SIG_DFL
    time.sleep(0.05)

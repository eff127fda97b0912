"""The preemption poller: Slurm's user signal on preemption does not always come (1 in 3 on the local 22.05
cluster), so the job's preempt_time is read in the background; a failing or hanging query decides nothing and
never holds up the caller."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from supervisor.driver.preempt_watch import PreemptionPoller


def _wait(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_a_preempt_time_is_seen_and_failed_queries_decide_nothing() -> None:
    answers = iter([RuntimeError("slurmctld unreachable"), None, SimpleNamespace(preempt_time=None),
                    SimpleNamespace(preempt_time=1796302027.0)])  # fmt: skip
    asked = []

    def query():
        asked.append(1)
        answer = next(answers, SimpleNamespace(preempt_time=1796302027.0))
        if isinstance(answer, Exception):
            raise answer
        return answer

    poller = PreemptionPoller(query, period_s=0.01)
    assert not poller.preempted()
    poller.start()
    try:
        assert _wait(poller.preempted)
        assert len(asked) >= 4  # the failure, the forgotten job and the job without a preemption came first
    finally:
        poller.close()


def test_a_hanging_query_never_blocks_the_caller() -> None:
    release = threading.Event()
    poller = PreemptionPoller(lambda: release.wait(10), period_s=0.01)
    poller.start()
    try:
        started = time.monotonic()
        for _ in range(100):
            assert not poller.preempted()
        assert time.monotonic() - started < 0.5
    finally:
        release.set()
        poller.close()


def test_the_newest_answer_gives_the_jobs_end_time() -> None:
    answers = iter([RuntimeError("slurmctld unreachable"), SimpleNamespace(preempt_time=None, end_time=1000.0),
                    SimpleNamespace(preempt_time=None, end_time=2000.0)])  # fmt: skip

    def query():
        answer = next(answers, SimpleNamespace(preempt_time=None, end_time=2000.0))
        if isinstance(answer, Exception):
            raise answer
        return answer

    poller = PreemptionPoller(query, period_s=0.01)
    assert poller.end_time() == (False, None)  # not asked yet: unknown, not "no time limit"
    poller.start()
    try:
        assert _wait(lambda: poller.end_time() == (True, 2000.0))  # an extended limit replaces the old one
        assert not poller.preempted()
    finally:
        poller.close()


def test_the_period_follows_the_partitions_settings_read_once() -> None:
    from supervisor.decisions.slurm_poll import FLOOR_S, STEADY_S, Preemptibility

    reads = []

    def settings() -> Preemptibility:
        reads.append(1)
        return Preemptibility(False, None, "PreemptMode=OFF")

    poller = PreemptionPoller(lambda: SimpleNamespace(preempt_time=None, end_time=1000.0), settings=settings)
    poller.start()
    try:
        assert _wait(lambda: poller.end_time() == (True, 1000.0))  # asked at once, not after the period
        assert poller.period_s == STEADY_S and reads == [1]
    finally:
        poller.close()

    def broken() -> Preemptibility:
        raise RuntimeError("slurmctld unreachable")

    cautious = PreemptionPoller(lambda: None, period_s=99.0, settings=broken)
    cautious.start()
    try:
        assert _wait(lambda: cautious.preemptibility is not None)
        assert cautious.period_s == FLOOR_S  # unknown: the fast query, never a missed preemption
    finally:
        cautious.close()


def test_a_refresh_asks_at_once_and_an_older_answer_no_longer_counts() -> None:
    ends = iter([1000.0, 2000.0])
    gate = threading.Event()

    def query():
        if not gate.is_set() and poller.queries > 1:
            gate.wait(5)
        return SimpleNamespace(preempt_time=None, end_time=next(ends, 2000.0))

    poller = PreemptionPoller(query, period_s=3600.0)
    poller.start()
    try:
        assert _wait(lambda: poller.end_time() == (True, 1000.0))
        poller.refresh()
        assert poller.end_time()[0] is False  # the answer from before the refresh is stale now
        gate.set()
        assert _wait(lambda: poller.end_time() == (True, 2000.0), timeout=2.0)  # not an hour later
    finally:
        poller.close()

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

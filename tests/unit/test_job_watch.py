"""One Slurm query for every campaign's job (supervisor/site/job_watch.py, the /v1/job-state endpoint, and the
campaign's side, supervisor/driver/job_query.py): the service reads every watched job with one query a round and
nothing while none is watched; a campaign uses the site's read only when it is fresh, and asks slurmctld itself
when the site is down (then not again for a minute), slow, not watching, or stale; a job Slurm no longer lists
is None either way, and a failed query is never an answer."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from supervisor.driver.job_query import BACKOFF_S, JobQuery
from supervisor.driver.preempt_watch import PreemptionPoller
from supervisor.site.auth import new_token, sign
from supervisor.site.client import SiteUnavailable
from supervisor.site.job_watch import WATCH_TTL_S, JobWatch
from supervisor.site.server import SiteApi
from supervisor.site.store import SiteStore

NOW = 1_800_000_000.0


class FakeSlurm:
    def __init__(self) -> None:
        self.queued = {"11": SimpleNamespace(job_id="11", state="RUNNING", preempt_time=None, end_time=int(NOW) + 600),
                       "12": SimpleNamespace(job_id="12", state="RUNNING", preempt_time=int(NOW), end_time=None)}
        self.calls: list[list[str]] = []
        self.fail = False

    def jobs(self, ids: list[str]) -> list[Any]:
        self.calls.append(list(ids))
        if self.fail:
            raise RuntimeError("slurmctld did not answer")
        return [self.queued[i] for i in ids if i in self.queued]


def test_one_query_a_round_for_every_watched_job_and_none_while_nobody_asks() -> None:
    clock = [NOW]
    slurm = FakeSlurm()
    watch = JobWatch(slurm, clock=lambda: clock[0])
    watch.round()
    assert slurm.calls == []  # nobody asked: Slurm is not asked either
    assert watch.answer("11")["read_at"] is None  # not read yet: the campaign asks slurmctld this once
    watch.answer("12")
    watch.answer("13")
    watch.round()
    assert slurm.calls == []  # one ask each: not yet known to be asked often
    clock[0] += 3
    for job in ("11", "12", "13"):
        watch.answer(job)
    watch.round()
    assert slurm.calls == [["11", "12", "13"]]
    got = {j: watch.answer(j) for j in ("11", "12", "13")}
    assert got["11"]["found"] and got["11"]["end_time"] == int(NOW) + 600 and got["11"]["read_at"] == NOW + 3
    assert got["12"]["preempt_time"] == int(NOW) and got["13"]["found"] is False  # not listed: said, not guessed
    slurm.fail = True
    clock[0] += 3
    watch.round()
    assert watch.answer("11")["read_at"] == NOW + 3  # the failed query left the old read, which now ages
    clock[0] += WATCH_TTL_S + 1
    slurm.fail = False
    watch.answer("11")
    watch.round()
    assert len(slurm.calls) == 2  # 11 was forgotten (asked again only now); 12 and 13 were not asked since
    clock[0] += 3
    watch.answer("11")
    watch.round()
    assert slurm.calls[-1] == ["11"]


def test_a_job_asked_about_once_per_five_minutes_is_never_read_for_it() -> None:
    """Its campaign cannot be preempted: any read would be stale at its next ask; it asks slurmctld itself."""
    clock = [NOW]
    slurm = FakeSlurm()
    watch = JobWatch(slurm, clock=lambda: clock[0])
    for _ in range(4):
        watch.answer("11")
        for _ in range(100):
            clock[0] += 3
            watch.round()
    assert slurm.calls == []


def test_the_endpoint_answers_any_user_and_checks_the_job_id(tmp_path: Path) -> None:
    store = SiteStore(tmp_path / "site")
    token = new_token()
    store.set_token("alice", token, admin=False, t=NOW)
    watch = JobWatch(FakeSlurm(), clock=lambda: NOW)

    def ask(api: SiteApi, path: str) -> tuple[int, dict]:
        return api.handle("GET", path, sign("alice", token, "GET", path, b"", now=NOW), b"")

    api = SiteApi(store, clock=lambda: NOW, job_watch=watch)
    assert ask(api, "/v1/job-state?job=11") == (200, {"job": "11", "read_at": None, "found": None, "watching": True})
    ask(api, "/v1/job-state?job=11")  # asked often (its poller's period): read every round
    watch.round()
    code, answer = ask(api, "/v1/job-state?job=11")
    assert code == 200 and answer["found"] is True and answer["end_time"] == int(NOW) + 600
    assert ask(api, "/v1/job-state?job=11;scancel")[0] == 400
    assert ask(SiteApi(store, clock=lambda: NOW), "/v1/job-state?job=11")[1]["watching"] is False


class FakeSite:
    def __init__(self, answer: dict[str, Any] | None) -> None:
        self.answer, self.calls = answer, 0

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        self.calls += 1
        assert path == "/v1/job-state?job=11"
        if self.answer is None:
            raise SiteUnavailable("the site service at http://x cannot be asked (refused)", "start it")
        return dict(self.answer)


def direct() -> Any:
    return SimpleNamespace(preempt_time=None, end_time=123, source="slurm")


@pytest.mark.parametrize(("answer", "via"), [
    ({"watching": True, "read_at": NOW - 2, "found": True, "preempt_time": int(NOW), "end_time": None}, "site"),
    ({"watching": True, "read_at": NOW - 60, "found": True, "preempt_time": None, "end_time": None}, "slurm"),
    ({"watching": True, "read_at": None, "found": None}, "slurm"),
    ({"watching": False, "read_at": None, "found": None}, "slurm"),
    ({"watching": True, "read_at": NOW + 60, "found": True}, "slurm"),  # a clock far off: not trusted
    ({"watching": True, "read_at": "soon", "found": True}, "slurm"),
])  # fmt: skip
def test_the_sites_read_is_used_only_when_fresh(answer: dict[str, Any], via: str) -> None:
    query = JobQuery(direct, FakeSite(answer), "11", clock=lambda: NOW)
    job = query()
    assert (query.via_site, query.via_slurm) == ((1, 0) if via == "site" else (0, 1))
    if via == "site":
        assert job.preempt_time == int(NOW) and job.age_s == pytest.approx(2.0)
    else:
        assert job.source == "slurm"


def test_a_job_slurm_no_longer_lists_is_none_and_a_dead_site_is_skipped_for_a_while() -> None:
    gone = JobQuery(direct, FakeSite({"watching": True, "read_at": NOW, "found": False}), "11", clock=lambda: NOW)
    assert gone() is None and gone.via_site == 1
    clock = [NOW]
    site = FakeSite(None)
    query = JobQuery(direct, site, "11", clock=lambda: clock[0])
    assert query().source == "slurm" and site.calls == 1
    clock[0] += 30
    assert query().source == "slurm" and site.calls == 1  # not asked again within the back-off
    clock[0] += BACKOFF_S
    site.answer = {"watching": True, "read_at": clock[0] - 1, "found": True, "preempt_time": None, "end_time": 99}
    assert query().end_time == 99 and site.calls == 2


def test_a_read_the_site_made_earlier_counts_from_when_it_was_made() -> None:
    """The time-limit clock asks for an answer newer than its refresh: a site read older than that is not one."""
    answers = iter([SimpleNamespace(preempt_time=None, end_time=500, age_s=0.0)] * 1000)
    poller = PreemptionPoller(lambda: next(answers), period_s=0.05)
    poller.start()
    try:
        deadline = time.monotonic() + 5
        while not poller.end_time()[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert poller.end_time() == (True, 500)
    finally:
        poller.close()
    stale = PreemptionPoller(lambda: SimpleNamespace(preempt_time=None, end_time=500, age_s=3600.0), period_s=0.05)
    stale.refresh()
    stale.start()
    try:
        time.sleep(0.3)
        assert stale.end_time()[0] is False  # every answer predates the refresh: not known yet
    finally:
        stale.close()

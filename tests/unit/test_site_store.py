"""The site ledger's SQLite store (supervisor/site/store.py): verdicts, jobs and forgiveness survive a restart of
the service, files are private, node-hours are clipped to the window, a second writer is not locked out, and a
file that is not a database is refused with one line, unchanged."""

from __future__ import annotations

import stat
import threading

import pytest

from supervisor.decisions.lemon import score_nodes
from supervisor.decisions.site_trust import SiteVerdict, excluded_for
from supervisor.site.store import SiteStore, SiteStoreError

H = 3600.0


def verdict(node: str, user: str, t: float, source: str = "node") -> SiteVerdict:
    return SiteVerdict(node=node, user=user, source=source, klass="hardware", campaign=f"{user}-c", t=t)


def test_what_campaigns_posted_survives_a_restart_and_feeds_both_rules(tmp_path) -> None:
    store = SiteStore(tmp_path / "site")
    store.job_started("11", ["n1", "n2"], user="alice", campaign="alice-c", t=0.0)
    store.add_verdict(verdict("n1", "alice", 5 * H), confidence=0.9, evidence=["Xid 79 on GPU 3"], job="11")
    store.add_verdict(verdict("n2", "alice", 6 * H, source="program"), confidence=0.5, evidence=["exit 1"], job="11")
    store.job_ended("11", 10 * H)
    store.close()
    again = SiteStore(tmp_path / "site")
    assert [(v.node, v.source) for v in again.verdicts()] == [("n1", "node"), ("n2", "program")]
    assert [e.node for e in excluded_for("bob", again.verdicts())] == ["n1"]  # bob: node evidence only
    assert again.exposure_h(0.0, 20 * H) == {"n1": pytest.approx(10.0), "n2": pytest.approx(10.0)}
    scores = score_nodes(again.failures(0.0, 20 * H), again.exposure_h(0.0, 20 * H), 20 * H)
    assert {s.node: s.failures for s in scores} == {"n1": 1, "n2": 1}


def test_the_directory_and_database_are_private(tmp_path) -> None:
    store = SiteStore(tmp_path / "site")
    store.job_started("1", ["a"], user="u", campaign="c", t=0.0)  # (the WAL files appear with a write)
    assert stat.S_IMODE((tmp_path / "site").stat().st_mode) == 0o700
    for name in ("site.db", "site.db-wal", "site.db-shm"):
        assert stat.S_IMODE((tmp_path / "site" / name).stat().st_mode) == 0o600, name


def test_node_hours_are_clipped_to_the_window_and_a_running_job_counts_until_now(tmp_path) -> None:
    store = SiteStore(tmp_path)
    store.job_started("1", ["a"], user="u", campaign="c", t=0.0)
    store.job_ended("1", 10 * H)
    store.job_started("2", ["a", "b"], user="u", campaign="c", t=20 * H)  # still running
    assert store.exposure_h(5 * H, 25 * H) == {"a": pytest.approx(10.0), "b": pytest.approx(5.0)}
    assert "c" not in store.exposure_h(0.0, 30 * H)  # no job ran there: not known to be zero


def test_forgiveness_clears_earlier_failures_only(tmp_path) -> None:
    store = SiteStore(tmp_path)
    for t in (1 * H, 2 * H, 9 * H):
        store.add_verdict(verdict("n1", "alice", t), confidence=1.0, evidence=[], job="j")
    store.forgive("n1", 5 * H, by="operator")
    assert [f.t for f in store.failures(0.0, 10 * H)] == [9 * H]
    assert store.forgiven_at() == {"n1": 5 * H}


def test_two_writers_at_once_lose_nothing(tmp_path) -> None:
    stores = [SiteStore(tmp_path), SiteStore(tmp_path)]

    def post(store: SiteStore, user: str) -> None:
        for i in range(100):
            store.add_verdict(verdict(f"n{i % 7}", user, float(i)), confidence=1.0, evidence=[], job=str(i))

    threads = [threading.Thread(target=post, args=(s, u)) for s, u in zip(stores, ("alice", "bob"), strict=True)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(SiteStore(tmp_path).verdicts()) == 200


def test_a_file_that_is_not_a_database_is_refused_and_left_alone(tmp_path) -> None:
    (tmp_path / "site.db").write_bytes(b"not sqlite at all " * 100)
    with pytest.raises(SiteStoreError) as info:
        SiteStore(tmp_path)
    assert "is not a readable site database" in info.value.one_line() and "move the file away" in info.value.one_line()
    assert (tmp_path / "site.db").read_bytes() == b"not sqlite at all " * 100

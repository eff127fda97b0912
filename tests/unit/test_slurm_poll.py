"""How often the supervisor asks slurmctld about its job (supervisor/decisions/slurm_poll.py): every quarter of
the grace time when the job can be preempted (a lost user signal still leaves 3/4 of it), every 5 minutes when
it cannot, today's 3 s when the settings are unknown; read from real ``scontrol`` lines of the local cluster."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from slurm.parse_config import parse_scontrol_partitions
from supervisor.decisions.slurm_poll import (
    FLOOR_S,
    GRACE_SHARE,
    STEADY_S,
    UNKNOWN,
    Preemptibility,
    grace_seconds,
    poll_period,
    preemptibility,
)

CONFIG = {"ClusterName": "local", "PreemptType": "preempt/partition_prio", "PreemptMode": "REQUEUE"}
BATCH, URGENT = parse_scontrol_partitions(
    "PartitionName=batch AllowGroups=ALL Default=YES GraceTime=10 PriorityTier=1 PreemptMode=REQUEUE State=UP\n"
    "PartitionName=urgent AllowGroups=ALL Default=NO GraceTime=0 PriorityTier=10 PreemptMode=OFF State=UP\n")


def test_the_local_clusters_partitions() -> None:
    batch = preemptibility(CONFIG, BATCH)
    assert (batch.can_be_preempted, batch.grace_s) == (True, 10.0)
    assert poll_period(batch) == FLOOR_S  # 10 s of grace: the fastest query (2.5 s would be under the floor)
    urgent = preemptibility(CONFIG, URGENT)
    assert urgent.can_be_preempted is False and "PreemptMode=OFF" in urgent.why
    assert poll_period(urgent) == STEADY_S


def test_a_site_without_preemption_is_asked_every_five_minutes() -> None:
    off = preemptibility({**CONFIG, "PreemptType": "preempt/none"}, BATCH)
    assert off.can_be_preempted is False and poll_period(off) == STEADY_S
    assert 60 / poll_period(off) <= 1  # one query is one RPC (scontrol --local): well under 2 per minute


def test_what_is_not_known_keeps_the_fast_query() -> None:
    assert preemptibility(None, BATCH) == UNKNOWN and preemptibility(CONFIG, None) == UNKNOWN
    assert preemptibility({"ClusterName": "x"}, {"PartitionName": "p"}) == UNKNOWN  # no PreemptType/Mode at all
    assert poll_period(UNKNOWN) == FLOOR_S
    assert poll_period(Preemptibility(True, None, "grace unreadable")) == FLOOR_S


def test_a_long_grace_time_is_polled_at_a_quarter_of_it() -> None:
    five_min = preemptibility(CONFIG, {**BATCH, "GraceTime": "300"})
    assert poll_period(five_min) == 75.0
    no_grace = preemptibility(CONFIG, {**BATCH, "GraceTime": "0"})
    assert poll_period(no_grace) == STEADY_S  # the SIGTERM comes at once, to every step: nothing to catch early


def test_grace_time_forms() -> None:
    assert grace_seconds("10") == 10.0
    assert grace_seconds("05:00") == 300.0
    assert grace_seconds("01:00:00") == 3600.0
    assert grace_seconds("1-00:00:00") == 86400.0
    assert grace_seconds("UNLIMITED") is None and grace_seconds("") is None


@given(st.text(max_size=30))
@example("²")  # a digit to str.isdigit, not to float() (hypothesis found it)
@example("1:²:00")
@example("٣")
def test_grace_seconds_never_raises(text: str) -> None:
    got = grace_seconds(text)
    assert got is None or got >= 0


@given(st.one_of(st.none(), st.booleans()), st.one_of(st.none(), st.floats(0, 1e7)))
def test_the_period_is_bounded_and_a_lost_signal_leaves_three_quarters_of_the_grace(can: bool | None,
                                                                                   grace: float | None) -> None:
    period = poll_period(Preemptibility(can, grace, ""))
    assert FLOOR_S <= period <= STEADY_S
    if can is not False and grace is not None and grace >= FLOOR_S / GRACE_SHARE and grace * GRACE_SHARE <= STEADY_S:
        assert period <= grace * GRACE_SHARE
    if can is None:
        assert period == FLOOR_S  # unknown: never slower than a known preemptible job


@given(st.floats(0.01, 1e6), st.floats(0.01, 1e6))
def test_a_longer_grace_never_asks_more_often(a: float, b: float) -> None:
    lo, hi = sorted((a, b))
    assert poll_period(Preemptibility(True, lo, "")) <= poll_period(Preemptibility(True, hi, ""))


@given(st.dictionaries(st.sampled_from(["PreemptType", "PreemptMode", "ClusterName"]), st.text(max_size=20)),
       st.dictionaries(st.sampled_from(["PartitionName", "PreemptMode", "GraceTime"]), st.text(max_size=20)))
def test_any_settings_give_an_answer(config: dict[str, str], partition: dict[str, str]) -> None:
    got = preemptibility(config, partition)
    assert FLOOR_S <= poll_period(got) <= STEADY_S

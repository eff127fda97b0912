"""The campaign simulator: sanity cases with known answers, every second accounted, the real decision code."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor import cli
from supervisor.decisions import checkpoint_interval as ci
from supervisor.decisions.ledger import LedgerConfig
from supervisor.simulate import compare, engine, trace
from supervisor.simulate.trace import Fault


def plain(stall: float, interval: float, restart: float, write: float = 0.0) -> engine.Strategy:
    """Requeue everything at once, no detection or queue cost: the Young/Daly model's own assumptions."""
    return engine.Strategy("model", False, stall, write, interval, restart, 0.0, 0.0, 0.0, 0.0)


def test_no_failures_goodput_is_one_minus_the_stall_fraction() -> None:
    world = engine.World(days=10.0)
    for strategy in (plain(2.0, 298.0, 0.0), replace(engine.supervised(stall_s=2.0, interval_s=298.0), restart_s=0.0)):
        out = engine.simulate(world, strategy, [])
        assert out.goodput == pytest.approx(1 - 2.0 / 300.0, abs=1e-6)
        assert out.buckets["checkpoint"] == pytest.approx(world.horizon_s * 2.0 / 300.0, abs=2.0)
        assert sum(out.interruptions.values()) == 0


@pytest.mark.parametrize(("delta", "restart", "expected"), [(1.0, 60.0, 0.981), (5.0, 60.0, 0.965), (30.0, 300.0, 0.90)])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_simulation_reproduces_young_daly(delta: float, restart: float, expected: float, seed: int) -> None:
    world = engine.World(seed=seed, bad_node_p=0.0)
    faults = trace.llama3(seed)
    mtbf = world.horizon_s / len(faults)
    assert mtbf == pytest.approx(3.1 * 3600, rel=0.08)  # Llama 3's rate
    out = engine.simulate(world, plain(delta, ci.young_interval(delta, mtbf), restart), faults)
    assert out.goodput == pytest.approx(ci.best_goodput(delta, restart, mtbf), abs=0.006)
    assert out.goodput == pytest.approx(expected, abs=0.01)


def test_segment_keeps_only_committed_checkpoints() -> None:
    seg = engine.segment(length_s=250.0, interval_s=100.0, stall_s=1.0, write_s=30.0)
    assert seg.committed == 2  # the second checkpoint (stall ends at 202) commits at 232 <= 250
    seg = engine.segment(length_s=220.0, interval_s=100.0, stall_s=1.0, write_s=30.0)
    assert seg.committed == 1 and seg.kept_s == 100.0  # the second is still being written
    assert seg.kept_s + seg.lost_s + seg.stall_s == pytest.approx(220.0)
    final = engine.segment(length_s=220.0, interval_s=100.0, stall_s=1.0, write_s=30.0, final=True)
    assert final.lost_s == 0.0


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 1000),
    days=st.floats(0.5, 5.0),
    gpus=st.sampled_from([64, 1024, 16_384]),
    stall=st.floats(0.0, 60.0),
    write=st.floats(0.0, 120.0),
    restart=st.floats(0.0, 600.0),
    hang=st.floats(0.0, 1.0),
    bad=st.floats(0.0, 1.0),
    scale=st.floats(0.0, 20.0),
)
def test_every_second_is_in_exactly_one_bucket(seed, days, gpus, stall, write, restart, hang, bad, scale) -> None:  # type: ignore[no-untyped-def]
    world = engine.World(gpus=gpus, days=days, seed=seed, hang_fraction=hang, bad_node_p=bad)
    faults = trace.llama3(seed, gpus, days, rate_scale=scale)
    for strategy in (engine.naive(stall_s=max(stall, 0.1)), engine.supervised(stall_s=stall, write_s=write,
                                                                              restart_s=restart, spares=2)):
        out = engine.simulate(world, strategy, faults)
        assert all(v >= 0 for v in out.buckets.values())
        assert sum(out.buckets.values()) == pytest.approx(world.horizon_s, rel=1e-9)
        assert 0.0 <= out.goodput <= 1.0


def test_the_supervisor_excludes_a_broken_node_that_naive_requeue_keeps_using() -> None:
    world = engine.World(gpus=64, days=4.0, bad_node_p=1.0, recur_mean_s=3600.0, site_drain_after=1000)
    faults = [Fault(3600.0, "gpu", "n00003")]
    naive = engine.simulate(world, engine.naive(), faults)
    sup = engine.simulate(world, engine.supervised(spares=1), faults)
    assert naive.recurrences > 5  # the Xid node keeps failing: nothing takes it out
    assert sup.recurrences == 0  # classify blamed it from its Xid line, the policy relaunched without it
    assert sup.interruptions == {"hardware": 1} and sup.relaunches == 1 and sup.requeues == 0


def test_without_spares_a_hardware_fault_requeues_without_the_node() -> None:
    world = engine.World(gpus=64, days=1.0, bad_node_p=1.0, recur_mean_s=600.0, site_drain_after=1000)
    out = engine.simulate(world, engine.supervised(spares=0), [Fault(3600.0, "hbm3", "n00001")])
    assert out.requeues == 1 and out.recurrences == 0
    assert out.buckets["queue"] == pytest.approx(120.0)


def test_a_nan_loss_rolls_back_without_waiting_for_a_person() -> None:
    world = engine.World(gpus=64, days=1.0, bad_node_p=0.0)
    out = engine.simulate(world, engine.supervised(), [Fault(3600.0, "sdc", "n00001")])
    assert out.interruptions == {"numerical": 1} and out.stops == 0 and out.relaunches == 1  # a roll back
    assert out.buckets.get("operator", 0.0) == 0.0
    stop = engine.supervised()
    stop = replace(stop, policy_config=replace(stop.policy_config, budgets={"numerical": 0}))
    held = engine.simulate(world, stop, [Fault(3600.0, "sdc", "n00001")])
    assert held.stops == 1 and held.buckets["operator"] == pytest.approx(3600.0)  # budget 0: a person decides


def test_hangs_cost_the_naive_strategy_its_collective_timeout() -> None:
    world = engine.World(gpus=64, days=1.0, bad_node_p=0.0)
    faults = [Fault(3600.0, "nccl_watchdog", "n00002")]  # always a hang
    assert engine.simulate(world, engine.naive(), faults).buckets["detection"] == pytest.approx(1800.0)
    sup = engine.simulate(world, engine.supervised(), faults)
    assert sup.buckets["detection"] == pytest.approx(3.3) and sup.interruptions == {"hang": 1}


def test_the_default_comparison_meets_its_shape() -> None:
    world = engine.World()
    faults = trace.llama3(world.seed)
    result = compare.compare(world, faults, engine.naive(), engine.supervised())
    assert 390 <= result.faults <= 450
    assert result.naive.goodput < result.supervised.goodput < result.optimum.goodput
    assert result.supervised.goodput >= 0.95
    doc = json.loads(json.dumps(result.to_dict()))
    assert set(doc) >= {"world", "naive", "supervised", "young_daly", "supervised_over_naive"}
    assert "(b)/(a)" in compare.render_text(result)


def test_traces_are_seeded_and_follow_the_llama3_mix() -> None:
    a, b = trace.llama3(7), trace.llama3(7)
    assert a == b and a != trace.llama3(8)
    big = trace.llama3(7, gpus=131_072)
    assert len(big) == pytest.approx(8 * trace.LLAMA3_TOTAL, rel=0.1)
    kinds = [f.kind for f in big]
    assert kinds.count("gpu") / len(kinds) == pytest.approx(148 / 419, abs=0.03)
    assert all(0 <= f.t < 54 * 86400 for f in big) and big == sorted(big, key=lambda f: f.t)


def test_csv_traces() -> None:
    faults = trace.parse_csv(["time,class,node", "7200,gpu,node7", "# a comment", "3600,software,node1"])
    assert faults == [Fault(3600.0, "software", "node1"), Fault(7200.0, "gpu", "node7")]
    for bad, words in ((["10,gpu"], "3 fields"), (["x,gpu,n1"], "not a number"), (["-1,gpu,n1"], ">= 0"),
                       (["10,meteor,n1"], "unknown class"), (["10,gpu,"], "empty node")):  # fmt: skip
        with pytest.raises(trace.TraceError, match=words):
            trace.parse_csv(bad, "t.csv")


def test_cli_json_and_errors(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    csv = tmp_path / "trace.csv"
    csv.write_text("time,class,node\n3600,gpu,n00001\n90000,host_maintenance,n00002\n")
    assert cli.main(["simulate", "--gpus", "64", "--days", "2", "--trace", str(csv), "--bad-node-p", "0",
                     "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["world"]["faults"] == 2 and doc["supervised"]["interruptions"] == {"hardware": 1, "node_failure": 1}
    assert cli.main(["simulate", "--trace", str(tmp_path / "missing.csv")]) == 2
    assert "cannot read trace" in capsys.readouterr().err
    assert cli.main(["simulate", "--hang-fraction", "1.5"]) == 2
    assert cli.main(["simulate", "--interval", "-3"]) == 2
    assert not math.isnan(doc["young_daly"]["goodput"])


def test_a_broken_node_stays_out_and_preflight_catches_one_a_fading_ledger_readmits() -> None:
    world = engine.World(gpus=64, days=3.0, bad_node_p=1.0, recur_mean_s=3600.0, site_drain_after=1000)
    faults = [Fault(3600.0, "gpu", "n00001"), Fault(30 * 3600.0, "software", "n00005")]
    # the default ledger: a hardware strike never fades, so the broken n00001 is never used again
    assert engine.simulate(world, engine.supervised(spares=2), faults).recurrences == 0
    # a ledger whose hardware strikes fade (6 h half-life): at the next fault the policy may use it again ...
    fading = replace(engine.supervised(spares=2), ledger_config=LedgerConfig(sticky=()))
    assert engine.simulate(world, fading, faults).recurrences > 0
    # ... unless a preflight finds it first
    with_preflight = engine.simulate(world, replace(fading, preflight_s=30.0, preflight_catch=1.0), faults)
    assert with_preflight.recurrences == 0
    assert with_preflight.buckets["preflight"] == pytest.approx(30.0 * (1 + 2))  # the first launch and two more


def test_the_recorded_journal_folds_to_the_same_accounting() -> None:
    """The simulation as journal events, folded by the report: the two accountings agree."""
    from supervisor.report_view import fold
    from supervisor.simulate.sim_journal import SimJournal

    world = engine.World(gpus=32, days=3.0, seed=3)
    faults = trace.llama3(3, 32, 3.0, rate_scale=300)
    events: list[dict] = []
    out = engine.simulate(world, engine.supervised(spares=1), faults, SimJournal(events.append))
    doc = fold(events, now=0.0)
    g = doc["goodput"]
    assert g["wall_s"] == pytest.approx(world.horizon_s)
    assert g["productive_s"] == pytest.approx(out.buckets["productive"], abs=0.001 * world.horizon_s)
    assert g["badput_s"]["checkpoint"] == pytest.approx(out.buckets["checkpoint"], abs=out.checkpoints * 1.0 + 1)
    assert g["badput_s"]["queue"] == pytest.approx(out.buckets["queue"])
    interrupted = [a["outcome"]["class"] for a in doc["attempts"] if a["outcome"]]
    assert interrupted.pop() == "completed" and doc["state"] == "completed"  # the horizon, written as a completion
    assert sorted(set(interrupted)) == sorted(out.interruptions)
    assert len(interrupted) == sum(out.interruptions.values())


def test_badput_by_class_adds_up_to_the_badput() -> None:
    world = engine.World(gpus=2048, days=20.0, seed=5)
    out = engine.simulate(world, engine.supervised(), trace.llama3(5, 2048, 20.0, rate_scale=4))
    badput = sum(v for k, v in out.buckets.items() if k not in ("productive", "checkpoint"))
    first_launch = 60.0  # the first start-up belongs to no interruption
    assert sum(out.badput_by_class.values()) == pytest.approx(badput - first_launch, rel=1e-9)


def test_policy_and_ledger_come_from_a_config_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    conf = tmp_path / "s.toml"
    conf.write_text("[ledger]\nhalf_life_s = 604800\n[policy]\nmax_restarts_in_allocation = 0\n")
    assert cli.main(["simulate", "--gpus", "512", "--days", "5", "--config", str(conf), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["supervised"]["relaunches"] == 0 and doc["supervised"]["requeues"] > 0  # every fault requeues
    conf.write_text("[ledger]\nhalf_life_s = -1\n")
    assert cli.main(["simulate", "--config", str(conf)]) == 3  # a configuration error, as for submit


def test_naive_requeue_meets_a_hardware_faults_node_again_until_the_site_takes_it_out() -> None:
    """Issue 13's baseline (a): no exclusion, so a bad node recurs. With the default world one faulty GPU comes
    back on the same node until the site drains it (its third fault); this supervisor excludes it at once."""
    world = engine.World(gpus=64, days=10.0)
    faults = [Fault(3600.0, "gpu", "n00002")]
    naive = engine.simulate(world, engine.naive(), faults)
    assert naive.interruptions == {"gpu": world.site_drain_after} and naive.recurrences == world.site_drain_after - 1
    sup = engine.simulate(world, engine.supervised(), faults)
    assert sup.interruptions == {"hardware": 1} and sup.recurrences == 0


def test_the_memory_tier_loses_only_the_work_since_the_newest_snapshot_when_the_fault_is_answered_in_place() -> None:
    """A fault answered by a relaunch in the allocation resumes from node memory: the lost work is under one
    snapshot interval instead of the time since the filesystem checkpoint; a requeue (no spares for a broken
    node) first flushes the newest snapshot to the filesystem (policy's FLUSH_MEMORY), which costs its copy."""
    world = engine.World(gpus=64, days=1.0, bad_node_p=0.0)
    fault = [Fault(5000.0, "software", "n00001")]
    plain_sup = engine.supervised(interval_s=3000.0, write_s=0.0)
    with_memory = replace(plain_sup, memory_stall_s=0.03)
    without = engine.simulate(world, plain_sup, fault)
    kept = engine.simulate(world, with_memory, fault)
    assert without.relaunches == kept.relaunches == 1
    assert 1900.0 < without.buckets["lost_work"] < 2000.0  # since the checkpoint committed ~3,000 s into the run
    every = ci.young_interval(0.03, ci.site_prior_mtbf_s(world.nodes))  # the cadence before any fault was seen
    assert kept.buckets["lost_work"] < every < 500.0
    assert kept.goodput > without.goodput
    assert sum(kept.buckets.values()) == pytest.approx(world.horizon_s)
    broken = engine.World(gpus=64, days=1.0, bad_node_p=1.0, site_drain_after=1000)
    requeued = [replace(s, spares=0) for s in (plain_sup, with_memory)]
    plain, flushed = (engine.simulate(broken, s, [Fault(5000.0, "hbm3", "n00001")]) for s in requeued)
    assert plain.requeues == flushed.requeues == 1
    assert flushed.buckets["lost_work"] < every < plain.buckets["lost_work"], "the requeue resumed from the flush"
    assert flushed.buckets["restart"] == pytest.approx(plain.buckets["restart"] + with_memory.memory_flush_s)


def test_faults_on_different_nodes_minutes_apart_stop_nobody_when_each_relaunch_resumes_from_newer_memory() -> None:
    """Five hardware faults on five nodes, ten minutes apart, no filesystem checkpoint between them: counted by
    filesystem checkpoints alone that is a crash loop (budget 3) and a person is called; with the memory tier each
    relaunch resumes from a newer snapshot, which is progress (policy.History.progress)."""
    world = engine.World(gpus=64, days=1.0, bad_node_p=0.0)
    faults = [Fault(5000.0 + 600.0 * i, "hbm3", f"n0000{i}") for i in range(5)]
    plain_sup = engine.supervised(interval_s=20000.0, write_s=0.0)
    without = engine.simulate(world, plain_sup, faults)
    kept = engine.simulate(world, replace(plain_sup, memory_stall_s=0.03), faults)
    assert without.stops == 1 and without.buckets["operator"] == pytest.approx(plain_sup.operator_s)
    assert kept.stops == 0 and kept.relaunches == 5 and kept.buckets["operator"] == 0.0


def test_requeues_after_a_persisted_run_leave_the_filesystem_intervals_mtbf() -> None:
    """With no spares every broken node requeues the job; each requeue resumes from the flushed snapshot. Without
    persisting they still count toward the MTBF the filesystem interval ("auto") is planned for (a flush can
    fail); with the snapshots persisted while each run lasted (``memory_persist_s``) they do not, so the program
    checkpoints to the filesystem less often and stalls less; each requeue still loses under a snapshot interval."""
    world = engine.World(gpus=64, days=4.0, bad_node_p=1.0, site_drain_after=1000)
    faults = [Fault(20000.0 * (i + 1), "hbm3", f"n0000{i}") for i in range(8)]
    tier = replace(engine.supervised(spares=0), memory_stall_s=0.03)
    plain = engine.simulate(world, tier, faults)
    persisted = engine.simulate(world, replace(tier, memory_persist_s=300.0), faults)
    assert plain.requeues == persisted.requeues == 8
    assert persisted.checkpoints < plain.checkpoints and persisted.buckets["checkpoint"] < plain.buckets["checkpoint"]
    every = ci.young_interval(0.03, ci.site_prior_mtbf_s(world.nodes))  # the snapshots' cadence (no fault in place)
    assert persisted.buckets["lost_work"] < 8 * every, "each requeue still resumed from its flushed snapshot"
    assert persisted.goodput > plain.goodput


def test_simulate_command_takes_the_memory_tier(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--gpus", "64", "--days", "2", "--memory-tier", "--json"]) == 0
    on = json.loads(capsys.readouterr().out)
    assert cli.main(["simulate", "--gpus", "64", "--days", "2", "--json"]) == 0
    off = json.loads(capsys.readouterr().out)
    assert on["supervised"] != off["supervised"]  # the snapshots' cost is accounted, with or without faults
    assert cli.main(["simulate", "--memory-tier", "--memory-stall", "-1"]) != 0
    assert cli.main(["simulate", "--memory-tier", "--persist-every", "0"]) != 0
    assert cli.main(["simulate", "--gpus", "64", "--days", "2", "--memory-tier", "--persist-every", "off",
                     "--json"]) == 0  # fmt: skip


def test_a_warm_restart_costs_its_own_restart_only_where_the_real_rule_allows_it() -> None:
    """A software fault answered in the allocation restarts warm (``--warm-restart`` seconds instead of the cold
    relaunch's); so does a hardware fault whose node the policy leaves out, its ranks moved to a spare; without a
    spare the job is requeued: cold (decisions/warm_restart.applies, placement_after)."""
    world = engine.World(gpus=64, days=1.0, bad_node_p=0.0)
    cold = engine.supervised(interval_s=3000.0, write_s=0.0, restart_s=60.0)
    warm = replace(cold, warm_restart_s=5.0)
    software = [Fault(5000.0, "software", "n00001")]
    a, b = engine.simulate(world, cold, software), engine.simulate(world, warm, software)
    assert (a.warm_restarts, b.warm_restarts) == (0, 1) and a.relaunches == b.relaunches == 1
    assert a.buckets["restart"] - b.buckets["restart"] == pytest.approx(55.0)
    assert sum(b.buckets.values()) == pytest.approx(world.horizon_s)
    hardware = [Fault(5000.0, "hbm3", "n00001")]
    moved = engine.simulate(engine.World(gpus=64, days=1.0, bad_node_p=1.0), warm, hardware)
    assert moved.relaunches == 1 and moved.warm_restarts == 1, "the faulty node's ranks moved to a spare, warm"
    requeued = engine.simulate(engine.World(gpus=64, days=1.0, bad_node_p=1.0), replace(warm, spares=0), hardware)
    assert requeued.requeues == 1 and requeued.warm_restarts == 0


def test_simulate_command_takes_the_warm_restart_cost(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--gpus", "64", "--days", "5", "--warm-restart", "10", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "warm_restarts" in doc["supervised"]
    assert cli.main(["simulate", "--warm-restart", "-1"]) != 0


def test_no_ratio_is_claimed_over_a_naive_run_that_kept_almost_nothing() -> None:
    """At 131,072 GPUs the naive run keeps seconds of 54 days: (b)/(a) printed "1252.18x"; now "-"."""
    from supervisor.simulate.compare import Comparison

    world = engine.World(gpus=64, days=1.0)
    naive, sup = engine.Outcome("naive", world.horizon_s), engine.Outcome("sup", world.horizon_s)
    sup.buckets["productive"] = 0.9 * world.horizon_s
    naive.buckets["productive"] = 60.0  # 0.07 %
    c = Comparison(world, 1, naive, sup, engine.optimum(world, [Fault(10.0, "gpu", "n00001")], 1.0, 60.0))
    assert c.ratio is None and c.to_dict()["supervised_over_naive"] is None
    naive.buckets["productive"] = 0.45 * world.horizon_s
    assert c.ratio == pytest.approx(2.0)

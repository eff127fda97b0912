"""Preflight's judgement on recorded worker results: a markedly slower node is flagged, nobody is blamed on
missing data, and a ping-pong with a single peer blames nobody for the link."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions.slow_nodes import Costs
from supervisor.health.preflight import judge, worker_argv


def _results(compute: dict[str, float], latency: dict[str, float] | None = None,
             bandwidth: dict[str, float] | None = None) -> list[dict]:  # fmt: skip
    nodes = list(compute)
    out = []
    for rank, node in enumerate(nodes):
        doc = {"rank": rank, "node": node, "ok": True, "compute_s": compute[node]}
        if rank == 0:
            doc["allreduce_busbw_Bps"] = 1e9
            doc["p2p"] = {str(r): {"latency_s": (latency or {}).get(n, 50e-6),
                                   "bandwidth_Bps": (bandwidth or {}).get(n, 3e9)}
                          for r, n in enumerate(nodes) if r}  # fmt: skip
        out.append(doc)
    return out


NODES = ["n1", "n2", "n3", "n4"]


def test_even_nodes_pass() -> None:
    v = judge(_results(dict.fromkeys(NODES, 0.1)), NODES)
    assert v.ok and not v.unknown and v.blamed_nodes == () and v.allreduce_busbw_Bps == 1e9


def test_slow_compute_latency_and_bandwidth_are_flagged() -> None:
    v = judge(_results({"n1": 0.1, "n2": 0.1, "n3": 0.45, "n4": 0.11}), NODES)
    assert v.blamed_nodes == ("n3",) and "compute" in v.slow["n3"]
    v = judge(_results(dict.fromkeys(NODES, 0.1), latency={"n2": 50e-6, "n3": 50e-6, "n4": 900e-6}), NODES, spares=1)
    assert v.blamed_nodes == ("n4",) and "latency" in v.slow["n4"]
    v = judge(_results(dict.fromkeys(NODES, 0.1), bandwidth={"n2": 3e9, "n3": 0.5e9, "n4": 3e9}), NODES)
    assert v.blamed_nodes == ("n3",) and "bandwidth" in v.slow["n3"]


def _rounds(compute: dict[str, list[float]], latency: dict[str, list[float]]) -> list[dict]:
    """Worker documents with per-round figures (rank 0 is the first node)."""
    nodes = list(compute)
    out = []
    for rank, node in enumerate(nodes):
        doc = {"rank": rank, "node": node, "ok": True, "compute_s": min(compute[node]),
               "compute_rounds_s": compute[node]}  # fmt: skip
        if rank == 0:
            doc["p2p"] = {str(r): {"latency_s": sorted(latency[n])[len(latency[n]) // 2], "latency_rounds_s": latency[n],
                                   "bandwidth_Bps": 3e9} for r, n in enumerate(nodes) if r}  # fmt: skip
        out.append(doc)
    return out


def test_one_noisy_round_leaves_nobody_out():
    """The loaded 2-core machine's case: one node's ping-pong caught a busy moment (1353 us vs 366 us) once."""
    even = [0.05] * 5
    latency = {"n2": [366e-6] * 5, "n3": [370e-6] * 5, "n4": [360e-6, 1353e-6, 380e-6, 1400e-6, 372e-6]}
    v = judge(_rounds(dict.fromkeys(NODES, even), latency), NODES, spares=1)
    assert v.ok and not v.slow and not v.kept, v


def test_a_node_slow_in_most_rounds_is_left_out_when_it_costs_more_than_its_spare():
    latency = {"n2": [300e-6] * 5, "n3": [310e-6] * 5, "n4": [1.5e-3, 1.4e-3, 300e-6, 1.6e-3, 1.5e-3]}
    v = judge(_rounds(dict.fromkeys(NODES, [0.05] * 5), latency), NODES, spares=1)
    assert v.blamed_nodes == ("n4",)
    assert "in 4 of 5 rounds" in v.slow["n4"] and "~12% slower" in v.slow["n4"] and "the spare it takes" in v.slow["n4"]


def test_without_a_spare_a_modest_slowdown_is_kept_and_said():
    """Leaving it out would cost a requeue (600 s by default): ~12 % of an hour (432 s) is not worth it."""
    latency = {"n2": [300e-6] * 5, "n3": [310e-6] * 5, "n4": [1.5e-3] * 5}
    v = judge(_rounds(dict.fromkeys(NODES, [0.05] * 5), latency), NODES, spares=0)
    assert v.ok and v.blamed_nodes == () and "kept" in v.kept["n4"] and "a requeue" in v.kept["n4"]
    twice = judge(_rounds(dict.fromkeys(NODES, [0.05] * 5), latency), NODES, spares=0, costs=Costs(horizon_s=7200))
    assert twice.blamed_nodes == ("n4",)  # a longer horizon: the same slowness now costs more than a requeue


def test_the_slowest_nodes_take_the_spares_first():
    compute = {"n1": [0.05] * 5, "n2": [0.05] * 5, "n3": [0.08] * 5, "n4": [0.5] * 5}
    v = judge(_rounds(compute, dict.fromkeys(NODES[1:], [300e-6] * 5)), NODES, spares=1)
    # n4 (10x) takes the spare; n3 (1.6x: under the factor) is not even slower
    assert v.blamed_nodes == ("n4",) and not v.kept


def test_tiny_latency_differences_are_noise() -> None:
    v = judge(_results(dict.fromkeys(NODES, 0.1), latency={"n2": 5e-6, "n3": 5e-6, "n4": 40e-6}), NODES)
    assert v.ok


def test_one_peer_cannot_blame_the_link() -> None:
    two = ["n1", "n2"]
    v = judge(_results({"n1": 0.1, "n2": 0.1}, latency={"n2": 1.0}, bandwidth={"n2": 1.0}), two)
    assert v.ok  # rank 0's ping-pong with its only peer cannot tell which end is slow
    v = judge(_results({"n1": 0.1, "n2": 0.5}), two)
    assert v.blamed_nodes == ("n2",)  # compute is measured on each node itself


def test_failed_or_missing_ranks_make_it_unknown_and_blame_nobody() -> None:
    results = _results(dict.fromkeys(NODES, 0.1))
    results[2] = {"rank": 2, "node": "n3", "ok": False, "error": "RuntimeError: Connection reset by peer"}
    v = judge(results, NODES)
    assert v.unknown and not v.ok and v.blamed_nodes == () and "Connection reset" in v.errors["n3"]
    v = judge(_results(dict.fromkeys(NODES, 0.1))[:3], NODES)
    assert v.unknown and "no result" in v.errors["n4"]


def test_worker_argv_is_one_task_per_node_overlapping_with_a_time_limit() -> None:
    argv = worker_argv(["node1", "node2", "node3"], __import__("pathlib").Path("/c/pf"), 30, python="/venv/python")
    assert argv[:2] == ["srun", "--overlap"] and "--nodelist=node[1-3]" in argv and "--ntasks-per-node=1" in argv
    assert "--time=1" in argv
    assert argv[-7:] == ["/venv/python", "-m", "supervisor.health.preflight_worker", "--out", "/c/pf", "--budget-s",
                         "30"]  # fmt: skip
    with pytest.raises(ValueError):
        judge([], NODES, factor=1.0)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.floats(0.01, 1.0), min_size=3, max_size=8))
def test_only_a_node_beyond_the_factor_is_flagged(times: list[float]) -> None:
    nodes = [f"n{i}" for i in range(len(times))]
    v = judge(_results(dict(zip(nodes, times, strict=True))), nodes)
    import statistics

    for i, n in enumerate(nodes):
        others = statistics.median(times[:i] + times[i + 1:])
        assert (n in v.slow) == (times[i] > 2.0 * others)

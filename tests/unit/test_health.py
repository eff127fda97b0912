"""Node health: the pure judgement of readings, and the real command on this (GPU-less) machine."""

from __future__ import annotations

import json
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st

from supervisor.health.checks import FATAL, WARN, GpuReading, Limits, NodeReading, evaluate, fit

HEALTHY_GPU = GpuReading(0, "H100", "GPU-1", ecc_uncorrectable_volatile=0, retired_pages_pending=False,
                         remap_pending=False, remap_failed=False, temperature_c=60, hw_slowdown=False)  # fmt: skip


def node(*gpus: GpuReading, **kw) -> NodeReading:
    base = {"node": "n1", "shm_writable": True, "shm_free_bytes": 1 << 30, "nvml": "ok", "gpus": gpus}
    base.update(kw)
    return NodeReading(**base)


def test_a_healthy_node_is_fit():
    assert evaluate(node(HEALTHY_GPU, HEALTHY_GPU)) == []


def test_hbm_and_lost_gpu_signs_make_the_node_unfit_with_a_fix():
    cases = {
        "uncorrectable ECC": GpuReading(0, ecc_uncorrectable_volatile=3),
        "failed a row remap": GpuReading(0, remap_failed=True),
        "pending row remap": GpuReading(0, remap_pending=True),
        "cannot be queried": GpuReading(0, error="GPU is lost"),
    }
    for needle, gpu in cases.items():
        problems = evaluate(node(gpu))
        assert not fit(problems) and needle in problems[0].what and problems[0].fix
    missing = evaluate(node(HEALTHY_GPU, expected_gpus=8))
    assert not fit(missing) and "1 GPUs visible, the allocation has 8" in missing[0].what


def test_heat_and_slowdown_only_warn():
    problems = evaluate(node(GpuReading(0, temperature_c=95, hw_slowdown=True)))
    assert {p.severity for p in problems} == {WARN} and fit(problems)


def test_shm_problems_are_fatal():
    assert evaluate(node(shm_writable=False))[0].severity == FATAL
    assert "MiB free" in evaluate(node(shm_free_bytes=1 << 20), Limits(min_shm_free_bytes=64 << 20))[0].what


@given(st.builds(GpuReading, index=st.integers(0, 7), ecc_uncorrectable_volatile=st.none() | st.integers(0, 5),
                 remap_pending=st.none() | st.booleans(), remap_failed=st.none() | st.booleans(),
                 temperature_c=st.none() | st.integers(20, 110)))  # fmt: skip
def test_unknown_readings_never_raise_alarms(gpu):
    """An unsupported query (None) is not evidence: only positive signs make a node unfit."""
    problems = evaluate(node(gpu))
    bad = bool(gpu.ecc_uncorrectable_volatile) or bool(gpu.remap_pending) or bool(gpu.remap_failed)
    assert fit(problems) == (not bad)


def test_the_command_on_this_machine():
    ok = subprocess.run([sys.executable, "-m", "supervisor.cli", "healthcheck", "--json"], capture_output=True,
                        text=True, timeout=60)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    doc = json.loads(ok.stdout)
    assert doc["fit"] and doc["reading"]["shm_writable"]
    if doc["reading"]["nvml"] != "ok":  # CPU machine: GPU checks skipped, and an allocation with GPUs is unfit
        bad = subprocess.run([sys.executable, "-m", "supervisor.cli", "healthcheck", "--expect-gpus", "1"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert bad.returncode == 8 and "unfit" in bad.stderr and bad.stderr.count("\n") == 1

"""Health judgements on recorded, NVML-shaped values: Xids, ECC, row remaps, retired pages, lost GPUs vs
CUDA_VISIBLE_DEVICES, throttling, power; filesystems and memory; the drain decision; the agent's entry."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm.model import NodeInfo
from supervisor.decisions import xid
from supervisor.health import xid as xid_events
from supervisor.health.checks import (
    FATAL,
    WARN,
    FsReading,
    GpuReading,
    Limits,
    MemReading,
    NodeReading,
    evaluate,
    fit,
)
from supervisor.health.drain import decide
from supervisor.health.periodic import AgentHealth, agent_checks

GIB = 1 << 30
# Recorded from an H100 SXM via nvidia-ml-py (shape of the values the probe stores).
H100 = GpuReading(0, "NVIDIA H100 80GB HBM3", "GPU-5f1b2c3d-0000-1111-2222-333344445555", ecc_uncorrectable_volatile=0,
                  retired_pages_pending=False, remap_pending=False, remap_failed=False, temperature_c=41,
                  hw_slowdown=False, ecc_uncorrectable_aggregate=0, retired_pages_dbe=0, throttle_reasons=0x4,
                  power_w=118.2, power_limit_w=700.0, pci_bus_id="00000000:18:00.0")  # fmt: skip


def node(*gpus: GpuReading, **kw) -> NodeReading:
    base = {"node": "n1", "shm_writable": True, "shm_free_bytes": 1 << 30, "nvml": "ok", "gpus": gpus}
    base.update(kw)
    return NodeReading(**base)


def test_a_busy_healthy_gpu_is_fit_and_power_cap_throttling_is_normal() -> None:
    assert evaluate(node(H100, H100)) == []  # SwPowerCap (0x4) under load is not a problem


@pytest.mark.parametrize("code", xid.codes(xid.HARDWARE))
def test_hardware_xids_make_the_node_unfit(code: int) -> None:
    gpu = GpuReading(0, uuid="GPU-1", xids=(xid_events.XidEvent(code, "0"),))
    (problem,) = evaluate(node(gpu))
    assert problem.severity == FATAL and problem.check == "xid" and problem.value == str(code)
    assert problem.reason() == f"supervise: xid {code} (threshold hardware Xid)"


@pytest.mark.parametrize("code", xid.codes(xid.APPLICATION))
def test_application_xids_only_warn(code: int) -> None:
    (problem,) = evaluate(node(GpuReading(0, xids=(xid_events.XidEvent(code, "0"),))))
    assert problem.severity == WARN and "application" in problem.threshold


def test_unknown_xid_warns_and_points_at_nvidia() -> None:
    (problem,) = evaluate(node(GpuReading(0, xids=(xid_events.XidEvent(999, "0"),))))
    assert problem.severity == WARN and "NVIDIA" in problem.fix


def test_kernel_log_xids_are_parsed_and_old_ones_are_history() -> None:
    records = [
        "4,1201,3600000000,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
        "4,1202,7100000000,-;NVRM: Xid (PCI:0000:3b:00): 13, Graphics SM Warp Exception",
        "6,1203,7150000000,-;eth0: link up",
    ]
    events = xid_events.parse_kmsg(records, uptime_s=7200.0)
    assert [(e.code, e.gpu, round(e.age_s)) for e in events] == [(79, "PCI:0000:3b:00", 3600), (13, "PCI:0000:3b:00", 100)]
    recent = evaluate(node(kernel_xids=tuple(events)), Limits(xid_window_s=1800))
    assert [(p.severity, p.value) for p in recent] == [(WARN, "13")]  # the 79 was an hour ago: outside the window
    assert not fit(evaluate(node(kernel_xids=tuple(events)), Limits(xid_window_s=7200)))


def test_memory_signs_each_with_a_fix() -> None:
    cases = {
        "uncorrectable ECC": GpuReading(0, ecc_uncorrectable_volatile=2),
        "failed a row remap": GpuReading(0, remap_failed=True),
        "pending row remap": GpuReading(0, retired_pages_pending=True),
    }
    for needle, gpu in cases.items():
        (problem,) = evaluate(node(gpu))
        assert problem.severity == FATAL and needle in problem.what and problem.fix
    (retired,) = evaluate(node(GpuReading(0, retired_pages_dbe=3)))
    assert retired.severity == WARN and retired.value == "3"


def test_gpus_missing_against_cuda_visible_devices() -> None:
    assert evaluate(node(H100, visible_devices=("0",))) == []
    (by_index,) = evaluate(node(H100, visible_devices=("0", "1")))
    assert by_index.severity == FATAL and by_index.value == "1"
    assert evaluate(node(H100, visible_devices=("GPU-5f1b2c3d",))) == []  # a UUID prefix, as CUDA accepts
    (by_uuid,) = evaluate(node(H100, visible_devices=("GPU-deadbeef",)))
    assert by_uuid.check == "gpus_missing"


def test_throttle_temperature_power_warn_only() -> None:
    hot = GpuReading(0, throttle_reasons=0x40 | 0x8, temperature_c=93, power_w=760.0, power_limit_w=700.0)
    problems = evaluate(node(hot))
    assert {p.check for p in problems} == {"gpu0_throttle", "gpu0_temperature", "gpu0_power"}
    assert fit(problems)
    assert next(p for p in problems if p.check == "gpu0_throttle").value == "hw_slowdown+hw_thermal_slowdown"


def test_filesystem_space_and_inodes() -> None:
    full = FsReading("/ckpt", "checkpoint", free_bytes=2 * GIB, total_bytes=100 * GIB, free_inodes=10**6,
                     total_inodes=10**7)  # fmt: skip
    (problem,) = evaluate(node(filesystems=(full,)))
    assert problem.severity == FATAL and problem.reason() == "supervise: fs_free:/ckpt 2.0GiB (threshold 5.0GiB)"
    no_inodes = FsReading("/runs", "campaign", free_bytes=50 * GIB, total_bytes=100 * GIB, free_inodes=12,
                          total_inodes=10**7)  # fmt: skip
    assert evaluate(node(filesystems=(no_inodes,)))[0].check == "fs_inodes:/runs"
    hung = FsReading("/nfs", "checkpoint", error="statvfs /nfs did not answer within 5 s")
    assert not fit(evaluate(node(filesystems=(hung,))))
    assert evaluate(node(filesystems=(full,)), Limits(fs_min_free_gib=1.0)) == []


def test_memory_pressure_warns_never_drains() -> None:
    tight = MemReading(total_bytes=100 * GIB, available_bytes=2 * GIB, psi_full_avg10=35.0)
    problems = evaluate(node(memory=tight))
    assert {p.check for p in problems} == {"mem_available", "mem_psi_full"} and fit(problems)


def test_no_gpu_is_a_clear_reading_not_an_alarm() -> None:
    assert evaluate(node(nvml="no NVIDIA GPU (NVML unavailable: ...)", visible_devices=("0",))) == []


def test_limits_from_the_command_line() -> None:
    assert Limits.from_pairs(["fs_min_free_gib=50", "fs_min_free_inodes=5"]) == Limits(fs_min_free_gib=50.0,
                                                                                       fs_min_free_inodes=5)
    for bad in ("nope=1", "fs_min_free_gib", "fs_min_free_gib=x", "fs_min_free_gib=nan", "fs_min_free_gib=-1"):
        with pytest.raises(ValueError, match="--limit"):
            Limits.from_pairs([bad])


def _info(reason: str | None, drained: bool) -> NodeInfo:
    return NodeInfo("n1", "IDLE", frozenset({"DRAIN"}) if drained else frozenset(), reason)


def test_drain_decision_owns_only_its_own_drains() -> None:
    bad = evaluate(node(filesystems=(FsReading("/c", "checkpoint", 1, 10 * GIB, 100000, 10**6),)))
    assert decide("n1", _info(None, False), bad).action == "drain"
    assert decide("n1", _info("supervise: xid 79 (threshold hardware Xid)", True), bad).action == "drain"  # new reason
    assert decide("n1", _info(decide("n1", _info(None, False), bad).reason, True), bad).action == "none"
    assert decide("n1", _info("admin: maintenance", True), bad).action == "none"
    assert decide("n1", _info("supervise: xid 79 (threshold hardware Xid)", True), []).action == "resume"
    assert decide("n1", _info("supervisor: hardware", True), []).action == "none"  # the policy's drain: not ours
    assert decide("n1", _info("admin", True), []).action == "none"
    assert decide("n1", None, bad).action == "none"


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.builds(GpuReading, index=st.integers(0, 7), xids=st.lists(
    st.builds(xid_events.XidEvent, code=st.integers(0, 200), gpu=st.just("0")), max_size=3).map(tuple),
    throttle_reasons=st.none() | st.integers(0, 0xFFFF), power_w=st.none() | st.floats(0, 2000),
    power_limit_w=st.none() | st.floats(0, 1000)), max_size=4))  # fmt: skip
def test_fitness_is_decided_by_hardware_evidence_only(gpus) -> None:
    problems = evaluate(node(*gpus))
    hardware = any(xid.kind_of(e.code) == xid.HARDWARE for g in gpus for e in g.xids)
    assert fit(problems) == (not hardware)
    assert all(p.check and p.value and p.threshold for p in problems)


def test_agent_entry_on_this_machine_names_the_node(tmp_path) -> None:
    assert agent_checks("n7", {"campaign": str(tmp_path)}) == []  # healthy, no GPU here: no findings
    found = agent_checks("n7", {"campaign": str(tmp_path)}, limits=Limits(fs_min_free_gib=1e9))
    assert [(f.node, f.fatal, f.check) for f in found] == [("n7", True, f"fs_free:{tmp_path}")]
    assert "threshold" in found[0].evidence()
    health = AgentHealth("n7", {"campaign": str(tmp_path)}, interval_s=30.0)
    assert health.poll(100.0) == [] and health.poll(110.0) is None and health.poll(130.0) == []
    health.close()


def test_a_failing_agent_check_blames_its_node_and_alerts_with_its_figures(tmp_path) -> None:
    """The agent's fatal finding, as the classifier's GPU-health evidence next to the peers' communication
    errors, makes the interruption a hardware fault on that node; the alert carries the check's figures."""
    from supervisor import alerts
    from supervisor.decisions import classify as cl
    from supervisor.decisions import policy

    finding = next(f for f in agent_checks("node3", {"checkpoint": str(tmp_path)}, limits=Limits(fs_min_free_gib=1e9)))
    evidence = cl.Evidence(
        rank_exits=(cl.RankExit(node="node1", exit_code=1), cl.RankExit(node="node3", exit_code=1)),
        log_lines=(cl.LogLine(text="RuntimeError: Connection reset by peer", node="node1"),),
        gpu_faults={finding.node: (finding.evidence(),)},
    )
    interruption = cl.classify(evidence)
    assert interruption.cls == "hardware" and interruption.blamed_nodes == ("node3",)
    decision = policy.decide(interruption, policy.History(), policy.Allocation(("node1", "node3"), 2, step_running=True))
    alert_action = next(a for a in decision.actions if a.kind == policy.ALERT)
    alert = alerts.build("9", "/c", alert_action.to_event(1.0), [finding.as_detection()],
                         interruption.to_event(1.0), actions_taken=[a.kind for a in decision.actions])  # fmt: skip
    assert (alert.metric, alert.value, alert.threshold) == (finding.check, finding.value, finding.threshold)
    assert alert.nodes == ("node3",) and alert.empty_fields() == []


def test_clock_offset_against_the_batch_host() -> None:
    assert evaluate(node(clock_offset_s=0.3)) == []
    (warn,) = evaluate(node(clock_offset_s=-4.0))
    assert warn.severity == WARN and warn.value == "-4.0s" and warn.check == "clock_offset"
    (fatal,) = evaluate(node(clock_offset_s=45.0))
    assert fatal.severity == FATAL and "freshness window" in fatal.fix
    assert evaluate(node(clock_offset_s=float("nan"))) == []  # not measured is not an alarm
    health = AgentHealth("n7", interval_s=30.0)
    (finding,) = health.poll(1.0, clock_offset_s=40.0)
    assert finding.node == "n7" and finding.fatal
    health.close()

"""Health in the node agents: the wire's health report (round trip, limits, fuzzing), the heartbeat table keeping
each node's newest report, the recorded-NVML seam running the real probe on a GPU fault, and the agent's
health thread sending reports (clock offset included)."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.agent.health_thread import HealthThread, report_event
from supervisor.agent.main import Agent, build_parser
from supervisor.health import reading
from supervisor.health.checks import FATAL, WARN, Limits, evaluate
from supervisor.health.periodic import AgentHealth
from supervisor.heartbeat import wire
from supervisor.heartbeat.table import LiveTable

KEY = wire.derive_key(b"h" * 32, b"chan")
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
ITEM = wire.HealthItem("fatal", "gpu0_ecc_uncorrectable", "2", "0", "GPU 0 has 2 uncorrectable ECC errors", "reset")
HEALTHY_GPU = {"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-6f1c", "pci_bus_id": "00000000:3B:00.0",
               "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0, "remapped_rows": [0, 0, 0, 0],
               "retired_pages_pending": 0, "retired_pages_dbe": [], "temperature_c": 41, "throttle_reasons": 0,
               "power_mw": 71000, "power_limit_mw": 700000}  # fmt: skip


def _events_frame(events: list[wire.Event], node: str = "n2", seq: int = 1) -> bytes:
    return wire.encode_events(KEY, instance=5, seq=seq, wall_ns=time.time_ns(), mono_ns=seq, job="9", node=node,
                              events=events)  # fmt: skip


# ------------------------------------------------------------------------------------------- the wire


def test_a_health_report_round_trips_fatal_first() -> None:
    warn = wire.HealthItem("warn", "gpu0_temperature", "93C", "90C", "GPU 0 runs at 93 C", "check cooling")
    report = wire.parse_health(wire.encode_health("ok", [warn, ITEM]))
    assert report.nvml == "ok" and report.findings == (ITEM, warn) and report.more == 0
    assert report.fatal == (ITEM,)
    clean = wire.parse_health(wire.encode_health("no NVIDIA GPU (NVML unavailable: Driver Not Loaded)", []))
    assert clean.findings == () and clean.nvml.startswith("no NVIDIA GPU")


def test_a_report_too_large_for_one_event_keeps_the_fatal_findings_and_counts_the_rest() -> None:
    many = [wire.HealthItem("warn", f"gpu{i}_throttle", "x" * 300, "none", "w" * 300, "f" * 300) for i in range(40)]
    text = wire.encode_health("ok", [*many, ITEM])
    assert len(text.encode()) <= wire.MAX_TEXT
    report = wire.parse_health(text)
    assert report.findings[0] == ITEM and report.more == 41 - len(report.findings) > 0


@pytest.mark.parametrize("text", [
    "", "[]", "{}", '{"nvml": "ok", "findings": [], "more": -1}', '{"nvml": 1, "findings": [], "more": 0}',
    '{"nvml": "ok", "findings": [["bad", "c", "v", "t", "w", "f"]], "more": 0}',
    '{"nvml": "ok", "findings": [["fatal", "", "v", "t", "w", "f"]], "more": 0}',
    '{"nvml": "ok", "findings": [["fatal", "c", "v", "t", "w"]], "more": 0}',
    '{"nvml": "ok", "findings": [], "more": 0, "x": 1}', '{"nvml": "ok", "findings": [], "more": true}',
    "[" * 5000,
])  # fmt: skip
def test_a_malformed_report_is_a_frame_error(text: str) -> None:
    with pytest.raises(wire.FrameError) as err:
        wire.parse_health(text)
    assert err.value.reason == "health"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                           lambda inner: st.lists(inner, max_size=7) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=4), max_leaves=30)  # fmt: skip
report_like = st.fixed_dictionaries({"nvml": json_values, "findings": json_values, "more": json_values})


@FUZZ
@given(text=st.one_of(st.text(max_size=300), json_values.map(json.dumps), report_like.map(json.dumps)))
def test_the_health_parser_raises_only_frame_errors(text: str) -> None:
    try:
        report = wire.parse_health(text)
    except wire.FrameError as err:
        assert err.reason == "health"
        return
    assert all(f.severity in wire.HEALTH_SEVERITIES and f.check for f in report.findings)


@FUZZ
@given(text=st.text(max_size=wire.MAX_TEXT // 4))
def test_the_table_keeps_a_valid_report_and_drops_any_other_text_without_raising(text: str) -> None:
    table = LiveTable(KEY, "9")
    assert table.feed(_events_frame([wire.Event(wire.EVENT_HEALTH, 1, text)]))
    assert table.counters == {"ok": 1}
    assert ("n2" in table.health) != (table.health_refused == 1)
    assert not table.events  # reports never crowd the stack results out of the bounded event queue


def test_the_table_keeps_each_nodes_newest_report() -> None:
    table = LiveTable(KEY, "9")
    table.feed(_events_frame([wire.Event(wire.EVENT_HEALTH, 1, wire.encode_health("ok", [ITEM]))], seq=1))
    table.feed(_events_frame([wire.Event(wire.EVENT_HEALTH, 2, wire.encode_health("ok", []))], seq=2))
    at, report = table.health["n2"]
    assert report.findings == () and abs(at - time.time()) < 60


# ------------------------------------------------------------------------------------------- recorded NVML


RECORDED = "SUPERVISOR_HEALTH_RECORDED"
SHADOW = Path(__file__).parents[1] / "harness" / "nvml_shadow" / "pynvml.py"


def _record(tmp_path: Path, doc: dict, monkeypatch: pytest.MonkeyPatch, node: str = "node2") -> None:
    """The tests' pynvml (tests/harness/nvml_shadow) in place of the real one, answering from ``doc``."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location("pynvml", SHADOW)
    assert spec is not None and spec.loader is not None
    shadow = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shadow)
    monkeypatch.setitem(sys.modules, "pynvml", shadow)
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps(doc))
    monkeypatch.setenv(RECORDED, str(path))
    monkeypatch.setenv("SLURMD_NODENAME", node)


def test_the_probe_reads_a_recorded_gpu_fault_and_the_xid_event_once(tmp_path: Path, monkeypatch) -> None:
    bad = {**HEALTHY_GPU, "uuid": "GPU-77aa", "ecc_uncorrected_volatile": 3, "remapped_rows": [0, 2, 1, 0]}
    _record(tmp_path, {"node2": {"gpus": [HEALTHY_GPU, bad], "xids": [{"gpu": 1, "code": 79}]}}, monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    health = AgentHealth("node2", {"campaign": str(tmp_path)}, expected_gpus=2, interval_s=30.0)
    try:
        first = health.poll(0.0)
        assert first is not None
        checks = {(f.severity, f.check, f.value) for f in first}
        assert (FATAL, "xid", "79") in checks and (FATAL, "gpu1_ecc_uncorrectable", "3") in checks
        assert (FATAL, "gpu1_remap_pending", "yes") in checks and all(f.node == "node2" for f in first)
        assert not any(f.check.startswith("gpu0") for f in first)
        again = health.poll(31.0)  # the Xid event was delivered once; the ECC count stays until a reset
        assert again is not None and {f.check for f in again} == {"gpu1_ecc_uncorrectable", "gpu1_remap_pending"}
    finally:
        health.close()


def test_recorded_lost_gpu_missing_devices_and_throttling(tmp_path: Path, monkeypatch) -> None:
    hot = {**HEALTHY_GPU, "temperature_c": 95, "throttle_reasons": 0x40 | 0x4}
    _record(tmp_path, {"*": {"gpus": [hot, {"lost": True}]}}, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    got = reading.read_node(2, node="any", kernel_log=False)
    found = {(p.severity, p.check, p.value) for p in evaluate(got)}
    assert found == {(FATAL, "gpus_missing", "2"), (FATAL, "gpu1_query", "error"), (WARN, "gpu0_temperature", "95C"),
                     (WARN, "gpu0_throttle", "hw_thermal_slowdown")}  # fmt: skip
    assert reading.read_node(3, node="any", kernel_log=False).gpus[1].error == "GPU is lost"


def test_no_gpu_is_a_clear_reading_never_an_exception(tmp_path: Path, monkeypatch) -> None:
    _record(tmp_path, {"node1": {"init_error": "Driver Not Loaded"}}, monkeypatch, node="node1")
    health = AgentHealth("node1", interval_s=30.0)
    assert health.nvml is None and health.nvml_status == "no NVIDIA GPU (NVML unavailable: NVMLError: " \
        "Driver Not Loaded)"  # fmt: skip
    assert health.poll(0.0) == []
    health.close()
    monkeypatch.setenv(RECORDED, str(tmp_path / "missing.json"))
    nvml, status = reading.open_nvml()
    assert nvml is None and "recorded readings unreadable" in status


def test_a_checkpoint_dir_not_made_yet_is_read_on_its_filesystem(tmp_path: Path) -> None:
    got = reading.read_fs(str(tmp_path / "ckpt" / "later"), "checkpoint", nearest_existing=True)
    assert got.error is None and got.free_bytes
    assert reading.read_fs(str(tmp_path / "nope"), "checkpoint").error  # the operator's command says so


# ------------------------------------------------------------------------------------------- the agent


def test_the_health_thread_reports_at_start_then_every_interval(tmp_path: Path) -> None:
    health = AgentHealth("n1", {"campaign": str(tmp_path)}, limits=Limits(fs_min_free_gib=1e9), interval_s=1.0)
    thread = HealthThread(health, lambda: 0.2)
    thread.start()
    try:
        got: list[wire.Event] = []
        deadline = time.monotonic() + 30
        while len(got) < 2 and time.monotonic() < deadline:
            got += thread.events()
            time.sleep(0.05)
    finally:
        thread.close()
    assert [e.rank for e in got[:2]] == [1, 2] and all(e.kind == wire.EVENT_HEALTH for e in got)
    report = wire.parse_health(got[0].text)
    assert [f.check for f in report.fatal] == [f"fs_free:{tmp_path}"]


def test_report_event_carries_every_field() -> None:
    health = AgentHealth("n1", interval_s=30.0)
    (finding,) = health.poll(0.0, clock_offset_s=45.0) or []
    health.close()
    event = report_event(7, "ok", [finding])
    (item,) = wire.parse_health(event.text).findings
    assert event.rank == 7 and (item.severity, item.check, item.value) == ("fatal", "clock_offset", "+45.0s")


def test_the_agent_sends_its_health_reports_and_measures_the_clock_offset(tmp_path: Path) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(20)
    slots = tmp_path / "slots"
    slots.mkdir(mode=0o700)
    args = build_parser().parse_args(["--campaign", str(tmp_path), "--job-id", "9", "--node", "n1",
                                      "--health-fs", f"checkpoint={tmp_path}", "--health-limit", "fs_min_free_gib=1e9",
                                      "--health-interval", "30"])  # fmt: skip
    from supervisor.agent.health_thread import health_from_args

    agent = Agent(job="9", node="n1", key=KEY, supervisor=server.getsockname(), slot_dir=slots, campaign=tmp_path,
                  keep_slot_dir=True, health=health_from_args(args), supervisor_timeout_s=5.0)  # fmt: skip
    try:
        control = wire.encode_control(KEY, instance=1, seq=1, wall_ns=time.time_ns() - 3 * 10**9, mono_ns=1,
                                      job="9", node="n1", commands=[wire.Command(wire.CMD_KEEPALIVE)])  # fmt: skip
        agent.handle(control)
        assert agent.clock_offset_s is not None and 2.5 < agent.clock_offset_s < 4.0
        agent.health.start()  # type: ignore[union-attr]
        events: list[wire.Event] = []
        deadline = time.monotonic() + 20
        while not events and time.monotonic() < deadline:
            events = agent.health.events()  # type: ignore[union-attr]
            time.sleep(0.02)
        agent.send_events(events)
        table = LiveTable(KEY, "9")
        assert table.feed(server.recv(wire.MAX_FRAME + 1))
        _, report = table.health["n1"]
        assert {f.check for f in report.fatal} == {f"fs_free:{tmp_path}"}
        assert [f.value for f in report.findings if f.check == "clock_offset"] == ["+3.0s"]  # warn: > 1 s
    finally:
        agent.close()
        server.close()


def test_bad_health_arguments_are_usage_errors() -> None:
    from supervisor.agent.health_thread import health_from_args
    from supervisor.errors import UsageError

    parser = build_parser()
    base = ["--campaign", "/c", "--node", "n1"]
    assert health_from_args(parser.parse_args([*base, "--health-interval", "0"])) is None
    for bad in (["--health-interval", "-1"], ["--health-fs", "nopath"], ["--health-limit", "nope=1"],
                ["--expect-gpus", "-2"]):  # fmt: skip
        with pytest.raises(UsageError):
            health_from_args(parser.parse_args([*base, *bad]))


def test_mac_of_a_health_frame_is_checked_first() -> None:
    frame = _events_frame([wire.Event(wire.EVENT_HEALTH, 1, wire.encode_health("ok", [ITEM]))])
    forged = frame[:-32] + hmac.digest(b"wrong key", frame[:-32], hashlib.sha256)
    table = LiveTable(KEY, "9")
    assert not table.feed(forged) and table.counters == {"rejected_mac": 1} and not table.health

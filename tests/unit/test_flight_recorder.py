"""The flight recorder's dumps name the rank a global stall waits for (decisions/flight_recorder.py,
driver/flight_dumps.py). The dumps are real: tests/fixtures/flight_recorder/capture.py (3 gloo ranks, rank 1 stuck
outside the next all-reduce; torch's JSON and pickle formats) and tests/fixtures/gpu_messages (one NCCL rank on
an H200)."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import classify as cl
from supervisor.decisions import events as ev
from supervisor.decisions import flight_recorder as fr
from supervisor.decisions.detect.findings import RANK_HANG
from supervisor.driver import distenv, flight_dumps

FIXTURES = Path(__file__).parents[1] / "fixtures"
STALL = FIXTURES / "flight_recorder"


@pytest.mark.parametrize("ext", ["json", "pickle"])
def test_the_rank_that_never_enqueued_the_collective_its_peers_wait_in_is_named(ext):
    dumps = {r: fr.parse_dump((STALL / f"rank_{r}.{ext}").read_bytes()) for r in range(3)}
    assert dumps[1].groups["0"] == fr.GroupStatus(enqueued=6, completed=6, desc=dumps[1].groups["0"].desc)
    lag = fr.lagging(dumps)
    assert lag is not None and lag.ranks == (1,)
    assert "ranks 0,2 wait inside collective #7; rank 1 completed #6 and never enqueued #7" in lag.evidence[0]


@pytest.mark.parametrize("path", sorted([*STALL.glob("*.pickle"), *FIXTURES.glob("gpu_messages/fr_*.pickle")]))
def test_torchs_pickles_are_read_as_the_data_they_hold_without_unpickling(path):
    raw = path.read_bytes()
    assert fr.data_from_pickle(raw) == pickle.loads(raw)  # noqa: S301 (our fixture: loads only checks the reader)


def test_the_nccl_dump_of_an_h200_is_read_in_both_formats():
    for name in ("fr_nccl_trace.json", "fr_nccl_trace.pickle"):
        dump = fr.parse_dump((FIXTURES / "gpu_messages" / name).read_bytes())
        assert dump.groups["0"].enqueued == 4 and dump.groups["0"].desc == "default_pg"


class _Runs:
    def __reduce__(self):  # a payload: unpickling it would run a command
        return (os.system, ("touch /tmp/flight-recorder-pwned",))


def test_a_pickle_that_would_import_or_call_is_refused_and_runs_nothing():
    for payload in (pickle.dumps(_Runs()), pickle.dumps({"pg_status": {"0": _Runs()}}, protocol=2)):
        with pytest.raises(fr.FlightRecorderError, match="not plain data"):
            fr.parse_dump(payload)
    assert not Path("/tmp/flight-recorder-pwned").exists()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400) | st.binary(max_size=400).map(lambda b: b"\x80\x02" + b))
def test_any_bytes_are_a_dump_or_a_flight_recorder_error(data):
    try:
        fr.parse_dump(data)
    except fr.FlightRecorderError:
        pass


def status(enqueued: int, completed: int) -> fr.Dump:
    return fr.Dump({"0": fr.GroupStatus(enqueued, completed)})


def test_nobody_is_named_when_more_ranks_lag_than_wait_or_the_laggard_itself_waits():
    assert fr.lagging({0: status(7, 6), 1: status(6, 6), 2: status(6, 6)}) is None  # a majority behind
    assert fr.lagging({0: status(7, 6), 1: status(7, 6), 2: status(6, 5)}) is None  # rank 2 waits in #6 itself
    assert fr.lagging({0: status(7, 7), 1: status(7, 7)}) is None  # nobody waits
    assert fr.lagging({0: status(7, 6)}) is None  # one dump compares with nothing


def test_the_launch_dumps_name_the_rank_and_its_node_and_odd_files_are_skipped(tmp_path):
    for r in range(3):
        shutil.copy(STALL / f"rank_{r}.json", tmp_path / f"rank_{r}")
    (tmp_path / "rank_7").write_bytes(b"\x80\x02cos\nsystem\n.")  # corrupt/hostile: skipped
    os.symlink("/etc/passwd", tmp_path / "rank_8")  # never followed
    os.mkfifo(tmp_path / "rank_9")  # never blocks the read
    found = flight_dumps.lag_detection(tmp_path, ("n1", "n2", "n3"), 1)
    assert found is not None
    t, detection = found
    assert detection.kind == RANK_HANG and detection.ranks == (1,) and detection.nodes == ("n2",)
    assert t == min((tmp_path / f"rank_{r}").stat().st_mtime for r in range(3))
    assert flight_dumps.lag_detection(tmp_path / "none", ("n1",), 1) is None


def test_a_stall_named_by_the_dumps_is_a_hang_on_that_node_not_a_communication_error(tmp_path):
    """Without the client a stall surfaces as the peers' collective timeout (a communication error, nobody
    blamed); the dumps name rank 1, so it is a hang and rank 1's node is the suspect."""
    for r in range(3):
        shutil.copy(STALL / f"rank_{r}.json", tmp_path / f"rank_{r}")
    t, detection = flight_dumps.lag_detection(tmp_path, ("n1", "n2", "n3"), 1)
    lines = ("0: [rank0]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE)",
             "2: [rank2]:[E] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=ALLREDUCE)")
    nodes = ("n1", "n2", "n3")
    evidence = cl.Evidence(detections=((t, detection),), log_lines=tuple(cl.LogLine(x) for x in lines),
                           task_nodes=nodes, allocation_nodes=nodes, job_state="RUNNING",
                           node_states=dict.fromkeys(nodes, "UP"))  # fmt: skip
    verdict = cl.classify(evidence)
    assert verdict.cls == ev.HANG and verdict.blamed_nodes == ("n2",), verdict


def test_the_launch_environment_turns_the_recorder_on_unless_the_user_chose():
    env = distenv.flight_recorder_env("/c/logs/train-1.fr/rank_", {})
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == env["TORCH_FR_DUMP_TEMP_FILE"] == "/c/logs/train-1.fr/rank_"
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in distenv.flight_recorder_env("/p", {"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})

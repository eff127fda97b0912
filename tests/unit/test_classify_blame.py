"""Blame rules: which evidence blames which node (docs/decisions.md, "Blame"), stopping is the user's right, and
missing Slurm data is unknown (nobody blamed on it)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import events as ev
from supervisor.decisions.classify import Evidence, LogLine, RankExit, classify, repeated_on_one_node
from supervisor.decisions.detect import NODE_SILENT, DetectionEvent
from supervisor.decisions.tasklog import task_nodes

NODES = ("node1", "node2", "node3")
LAYOUT = task_nodes(NODES, 2)  # ranks 0,1 on node1; 2,3 on node2; 4,5 on node3
SLURM_OK = {"job_state": "RUNNING", "allocation_nodes": NODES, "task_nodes": LAYOUT,
            "node_states": {n: "MIXED" for n in NODES}}  # fmt: skip


def run(*lines: str, exits: tuple[RankExit, ...] = (), **extra: object):
    return classify(Evidence(**{**SLURM_OK, **extra}, log_lines=tuple(LogLine(x) for x in lines), rank_exits=exits))


# (labelled log line as srun --label writes it, class, blamed nodes). Only what names the hardware blames a node;
# the ambiguous GPU-level errors are the program's (or the network's) without corroboration (test_root_cause.py).
HARDWARE_LINES = [
    ("3: NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.", ev.HARDWARE, ("node2",)),
    ("4: RuntimeError: CUDA error: uncorrectable ECC error encountered", ev.HARDWARE, ("node3",)),
    ("0: RuntimeError: CUDA error: an illegal memory access was encountered", ev.APP_ERROR, ()),
    ("5: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error "
     "(run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3", ev.COMM_ERROR, ()),
    ("2: [rank2]: RuntimeError: CUDA error: an illegal memory access was encountered", ev.APP_ERROR, ()),
    # no label, no layout: the line's node is unknown, so nobody is blamed
    ("RuntimeError: CUDA error: uncorrectable ECC error encountered", ev.HARDWARE, ()),
]


@pytest.mark.parametrize("line,cls,blamed", HARDWARE_LINES)
def test_hardware_lines_blame_the_node_they_came_from(line, cls, blamed):
    rank = int(line.split(":")[0]) if line[0].isdigit() else 0  # the writer exits 1 after its error
    result = run(line, exits=(RankExit(LAYOUT[rank], rank, 1),))
    assert (result.cls, result.blamed_nodes) == (cls, blamed)


def test_a_hardware_line_outranks_the_comm_errors_and_crashes_it_causes():
    peers = [f"{r}: RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection closed by peer" for r in (0, 1, 4, 5)]
    result = run("3: NVRM: Xid 79 GPU has fallen off the bus", *peers,
                 exits=tuple(RankExit(LAYOUT[r], r, 1) for r in range(6)))  # fmt: skip
    assert result.cls == ev.HARDWARE and result.blamed_nodes == ("node2",)


@pytest.mark.parametrize(
    "faults,blamed",
    [({"node2": ("ecc: 3 uncorrectable errors",)}, ("node2",)),
     ({"node1": ("xid 79",), "node3": ("gpu lost",)}, ("node1", "node3")),
     ({}, ())],
)  # fmt: skip
def test_nvml_faults_blame_their_node(faults, blamed):
    result = classify(Evidence(**SLURM_OK, gpu_faults=faults, rank_exits=(RankExit("node1", 0, 1),)))
    assert result.blamed_nodes == blamed
    assert result.cls == (ev.HARDWARE if faults else ev.APP_ERROR)


SILENT = {n: (3.0, DetectionEvent(NODE_SILENT, (), (n,))) for n in NODES}


@pytest.mark.parametrize(
    "silent,node_states,allocation,cls,blamed",
    [
        (NODES, {n: "MIXED" for n in NODES}, NODES, ev.UNKNOWN, ()),  # every agent at once: our side
        (NODES, {}, NODES, ev.UNKNOWN, ()),  # ... whatever Slurm says or does not say
        (("node1",), {"node1": "MIXED"}, ("node1",), ev.UNKNOWN, ()),  # a one-node step: all silent too
        (NODES, {"node2": "DOWN*"}, NODES, ev.NODE_FAILURE, ("node2",)),  # Slurm's word still blames
        (("node2",), {n: "MIXED" for n in NODES}, NODES, ev.NODE_FAILURE, ("node2",)),  # one of three: weak blame
        (("node2",), {}, NODES, ev.NODE_FAILURE, ()),  # Slurm's node state unknown: no blame
        (("node2",), {n: "MIXED" for n in NODES}, (), ev.NODE_FAILURE, ()),  # step nodes unknown: no blame
    ],
)
def test_silent_agents(silent, node_states, allocation, cls, blamed):
    e = Evidence(job_state="RUNNING", detections=tuple(SILENT[n] for n in silent), node_states=node_states,
                 allocation_nodes=allocation)  # fmt: skip
    result = classify(e)
    assert (result.cls, result.blamed_nodes) == (cls, blamed)


ADDRESSES = {"node1": "10.0.0.1", "node2": "10.0.0.2", "node3": "10.0.0.3"}


@pytest.mark.parametrize(
    "lines,addresses,blamed",
    [
        # gloo names the peer by address; node1's ranks and node3's ranks all point at node2
        (["0: RuntimeError: [pair.cc:598] Connection closed by peer [10.0.0.2]:41234",
          "4: RuntimeError: [pair.cc:598] Connection reset by peer [10.0.0.2]:41235"], ADDRESSES, ("node2",)),
        # NCCL names the remote by host name; the writer's own host (its prefix) is not the peer
        (["1: node1:811:902 [0] NCCL WARN NET/Socket : Connection closed by remote peer node3<45342>",
          "1: ncclRemoteError: A call failed possibly due to a network error or a remote process exited"],
         {}, ("node3",)),
        # c10d: connection refused by an address of node2
        (["3: torch.distributed.DistNetworkError: Connection refused: connect to 10.0.0.2:29500"], ADDRESSES, ()),
        (["5: torch.distributed.DistNetworkError: Connection refused: connect to 10.0.0.2:29500"], ADDRESSES,
         ("node2",)),
        # no peer named: nobody
        (["0: [E ProcessGroupNCCL.cpp:475] Watchdog caught collective operation timeout"], ADDRESSES, ()),
        # every node named by another (a ring of errors): the network, not a node
        (["0: Connection closed by peer [10.0.0.2]:1", "2: Connection closed by peer [10.0.0.3]:1",
          "4: Connection closed by peer [10.0.0.1]:1"], ADDRESSES, ()),
        # one host running several slurmd (the local cluster): a shared address names nobody
        (["0: Connection closed by peer [127.0.0.1]:41234"], {n: "127.0.0.1" for n in NODES}, ()),
        (["0: Connection closed by peer [192.168.0.9]:41234"], {n: "192.168.0.9" for n in NODES}, ()),
    ],
)
def test_comm_errors_blame_the_node_the_peers_name(lines, addresses, blamed):
    ranks = sorted({int(line.split(":")[0]) for line in lines})  # each writer exits 1 after its error
    result = run(*lines, exits=tuple(RankExit(LAYOUT[r], r, 1) for r in ranks), node_addresses=addresses)
    assert result.cls == ev.COMM_ERROR and result.blamed_nodes == blamed
    # (rank 3 is on node2 itself: a line naming its own node's address is not a remote peer)


@pytest.mark.parametrize(
    "history,where,blamed",
    [
        ((), ("node2",), ()),  # the first crash: a program bug until it repeats
        ((("node2",),), ("node2",), ("node2",)),  # again on node2 and nowhere else: node2
        ((("node1",), ("node2",)), ("node2",), ()),  # it also happened on node1: the program
        ((("node2",), ()), ("node2",), ("node2",)),  # an earlier crash of unknown place neither confirms nor refutes
        ((("node2",),), ("node1", "node2"), ()),  # this time on two nodes
        ((("node2", "node3"),), ("node2",), ()),
        ((("node1",), ("node2",), ("node2",), ("node2",)), ("node2",), ("node2",)),  # only the last 3 count
    ],
)
def test_an_app_error_blames_a_node_only_when_it_repeats_there_and_nowhere_else(history, where, blamed):
    lines = [f"{LAYOUT.index(n)}: Traceback (most recent call last):" for n in where]
    lines += [f"{LAYOUT.index(n)}: ValueError: bad" for n in where]
    exits = tuple(RankExit(n, LAYOUT.index(n), 1) for n in where)
    result = run(*lines, exits=exits, app_error_history=history)
    assert result.cls == ev.APP_ERROR and result.blamed_nodes == blamed
    assert result.origin_nodes == tuple(sorted(where))
    assert result.to_event(1.0)["origin_nodes"] == sorted(where)


@settings(max_examples=200)
@given(origin=st.lists(st.sampled_from(NODES), max_size=2),
       history=st.lists(st.lists(st.sampled_from(NODES), max_size=2).map(tuple), max_size=5))  # fmt: skip
def test_app_error_blame_needs_a_repeat_on_the_same_single_node(origin, history):
    node = repeated_on_one_node(tuple(origin), tuple(history))
    if node is not None:
        assert set(origin) == {node}
        recent = [set(o) for o in history if o][-3:]
        assert {node} in recent and all(o <= {node} for o in recent)


# ---- stopping is the user's right -------------------------------------------------------------------------

YEAR = 365 * 86400.0


@pytest.mark.parametrize(
    "evidence,cls",
    [
        # no time limit (a partition without one, no --time): a TERM can only be a cancel, whatever EndTime says
        (dict(job_state="COMPLETING", end_time=5000.0, batch_signals=(("TERM", 5000.1),)), ev.CANCELLED),
        (dict(job_state="RUNNING", end_time=5000.0, batch_signals=(("TERM", 5000.4),)), ev.CANCELLED),
        (dict(job_state=None, end_time=None, batch_signals=(("TERM", 5000.4),)), ev.CANCELLED),
        # Slurm sets an unlimited job's EndTime a year after its start; scancel moves it to now
        (dict(job_state="COMPLETING", end_time=5000.0, scheduled_end=1000.0 + YEAR,
              batch_signals=(("TERM", 5000.1),)), ev.CANCELLED),
        # a time limit, cancelled before it: EndTime moved to the cancel
        (dict(job_state="COMPLETING", end_time=5000.0, scheduled_end=9000.0, batch_signals=(("TERM", 5000.1),)),
         ev.CANCELLED),
        # the time limit itself: EndTime unchanged, TERM at it
        (dict(job_state="RUNNING", end_time=9000.0, scheduled_end=9000.0, batch_signals=(("TERM", 9000.3),)),
         ev.TIMEOUT),
        # a second scancel, while the supervisor was busy killing a hung step itself
        (dict(job_state="CANCELLED", supervisor_killed=True, batch_signals=(("TERM", 10.0),)), ev.CANCELLED),
        (dict(job_state="CANCELLED", end_time=10.0, scheduled_end=10.0, batch_signals=(("TERM", 10.0),)),
         ev.CANCELLED),
    ],
)
def test_a_job_without_a_time_limit_never_times_out_and_scancel_is_cancelled(evidence, cls):
    exits = (RankExit("node1", 0, 143), RankExit("node2", 1, 143))
    result = classify(Evidence(**evidence, sigterm_ranks=(0, 1), rank_exits=exits))
    assert result.cls == cls and result.blamed_nodes == ()


@settings(max_examples=200)
@given(end=st.one_of(st.none(), st.floats(0, 1e6)), term=st.floats(0, 1e6),
       state=st.sampled_from([None, "RUNNING", "COMPLETING", "CANCELLED"]))  # fmt: skip
def test_no_time_limit_no_timeout(end, term, state):
    result = classify(Evidence(job_state=state, end_time=end, batch_signals=(("TERM", term),)))
    assert result.cls == ev.CANCELLED


# ---- decide on complete evidence --------------------------------------------------------------------------


def test_an_unknown_job_state_lowers_confidence_and_says_so():
    e = dict(rank_exits=(RankExit("node1", 0, 1),), log_lines=(LogLine("ValueError: x", "node1", 0),))
    known, unknown = classify(Evidence(job_state="RUNNING", **e)), classify(Evidence(**e))
    assert known.cls == unknown.cls == ev.APP_ERROR
    assert unknown.confidence < known.confidence
    assert any("job state is unknown" in line for line in unknown.evidence)


@settings(max_examples=200)
@given(silent=st.lists(st.sampled_from(NODES), min_size=1, unique=True),
       states=st.dictionaries(st.sampled_from(NODES), st.sampled_from(["MIXED", "IDLE", "ALLOCATED"])),
       allocation=st.sampled_from([(), NODES]))  # fmt: skip
def test_no_node_is_blamed_on_missing_data(silent, states, allocation):
    """Agents' silence blames a node only if the step's nodes and that node's Slurm state are known."""
    e = Evidence(detections=tuple(SILENT[n] for n in silent), node_states=states, allocation_nodes=allocation)
    result = classify(e)
    for node in result.blamed_nodes:
        assert allocation and node in states and node in silent
    if allocation and set(silent) == set(allocation):
        assert result.blamed_nodes == ()


def test_a_labelled_comm_error_explains_its_ranks_exit_even_without_the_task_layout():
    lines = tuple(LogLine(f"{r}: RuntimeError: [pair.cc:598] Connection closed by peer") for r in (0, 1))
    exits = (RankExit("node1", 0, 1), RankExit("node2", 1, 1))
    assert classify(Evidence(job_state="RUNNING", log_lines=lines, rank_exits=exits)).cls == ev.COMM_ERROR


@pytest.mark.parametrize(
    "history,ranks,where,rank,blamed",
    [
        # a rank-0-only bug: rank 0 always lands on node1, so it "repeats on node1 and nowhere else"
        ((("node1",),), ((0,),), "node1", 0, ()),
        ((("node1",), ("node1",)), ((0,), (0,)), "node1", 0, ()),
        # the ranks moved (rank 1 crashed on node2, then rank 0 there): the crash follows the node
        ((("node2",),), ((1,),), "node2", 0, ("node2",)),
        # the ranks moved and the crash followed rank 0 to node2: the program's
        ((("node1",),), ((0,),), "node2", 0, ()),
        # ranks not recorded (an older journal): the node rule alone, as before
        ((("node2",),), (), "node2", 1, ("node2",)),
    ],
)
def test_a_crash_that_keeps_to_one_rank_is_not_blamed_on_its_node_until_the_ranks_moved(history, ranks, where,
                                                                                         rank, blamed):
    result = run(f"{rank}: Traceback (most recent call last):", f"{rank}: ValueError: bad",
                 exits=(RankExit(where, rank, 1),), task_nodes=tuple(LAYOUT_OF(where, rank)),
                 app_error_history=history, app_error_rank_history=ranks)  # fmt: skip
    assert result.cls == ev.APP_ERROR and result.blamed_nodes == blamed
    assert result.origin_ranks == (rank,) and result.to_event(1.0)["origin_ranks"] == [rank]
    if not blamed and history[-1] == (where,):
        assert any("may follow the rank" in line for line in result.evidence), result.evidence


def LAYOUT_OF(node: str, rank: int) -> list[str]:  # noqa: N802 - two ranks, ``rank`` on ``node``
    other = next(n for n in NODES if n != node)
    return [node, other] if rank == 0 else [other, node]

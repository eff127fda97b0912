"""srun --label log lines: the task prefix parsed, the task mapped to its node, the program's text recovered."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions.tasklog import LogLine, attribute, rank_of, split_label, strip_label, task_nodes


@pytest.mark.parametrize(
    "line,task,text",
    [
        ("0: step=5 loss=0.25", 0, "step=5 loss=0.25"),
        (" 3: step=5 loss=0.25", 3, "step=5 loss=0.25"),  # srun pads ids to the widest one
        ("12: Traceback (most recent call last):", 12, "Traceback (most recent call last):"),
        ("step=5 loss=0.25", None, "step=5 loss=0.25"),  # not labelled: unchanged
        ("0: ", 0, ""),
        ("srun: error: node2: task 3: Exited with exit code 1", None, "srun: error: node2: task 3: Exited with exit code 1"),
    ],
)  # fmt: skip
def test_split_label(line, task, text):
    assert split_label(line) == (task, text)
    assert strip_label(line) == text


def test_torch_rank_prefix_without_and_under_a_label():
    assert rank_of("[rank3]: RuntimeError: x") == (3, "RuntimeError: x")
    assert rank_of("3: [rank3]: RuntimeError: x") == (3, "RuntimeError: x")


def test_block_layout():
    assert task_nodes(("a", "b", "c"), 2) == ("a", "a", "b", "b", "c", "c")
    assert task_nodes(("a", "b"), 3, ntasks=4) == ("a", "a", "a", "b")
    with pytest.raises(ValueError, match="tasks_per_node"):
        task_nodes(("a",), 0)


def test_attribute_gives_rank_node_and_the_programs_text():
    lines = attribute(["1: step=1 loss=0.5", "2: NVRM: Xid 79", "srun: error: oops", "9: out of range"],
                      task_nodes(("node1", "node2"), 2))  # fmt: skip
    assert lines == (
        LogLine("step=1 loss=0.5", "node1", 1),
        LogLine("NVRM: Xid 79", "node2", 2),
        LogLine("srun: error: oops", None, None),
        LogLine("out of range", None, 9),
    )


@given(nodes=st.lists(st.text("abcdefgh0123456789", min_size=1, max_size=6), min_size=1, max_size=8, unique=True),
       per_node=st.integers(1, 8), text=st.text(max_size=40).filter(lambda t: "\n" not in t))  # fmt: skip
def test_every_task_maps_to_its_block_and_labels_round_trip(nodes, per_node, text):
    layout = task_nodes(nodes, per_node)
    assert len(layout) == len(nodes) * per_node
    width = len(str(len(layout) - 1))
    for task, node in enumerate(layout):
        assert node == nodes[task // per_node]
        labelled = f"{task:>{width}}: {text}"
        assert split_label(labelled) == (task, text)
        (line,) = attribute([labelled], layout)
        assert (line.rank, line.node, line.text) == (task, node, text)


def test_real_srun_label_output_maps_to_the_nodes_slurm_used():
    """Measured on the local cluster: ``srun -N 3 --ntasks-per-node=4 --label bash -c 'echo x $SLURMD_NODENAME'``."""
    out = [f"{t:>2}: x node{t // 4 + 1}" for t in range(12)]
    assert out[0] == " 0: x node1" and out[10] == "10: x node3"
    for line in attribute(out, task_nodes(("node1", "node2", "node3"), 4)):
        assert line.text == f"x {line.node}"


def test_srun_task_exit_lines_name_the_task_its_node_and_how_it_ended():
    from supervisor.decisions.tasklog import TaskExit, srun_task_exits

    lines = [
        "0: step=23 loss=0.6",
        "srun: error: node2: task 1: Killed",
        "srun: launch/slurm: _step_signal: Terminating StepId=1707002.1",
        "0: slurmstepd-node1: error: *** STEP 1707002.1 ON node1 CANCELLED AT 2026-12-03T07:58:02 ***",
        "srun: error: node1: task 0: Terminated",
        "srun: error: node3: tasks 4-5,7: Exited with exit code 1",
        "srun: error: node4: task 6: Segmentation fault (core dumped)",
        "srun: error: node2: task 1: Exited with exit code 137",  # reported twice: the first report stays
        "srun: error: node9: task 8: Something new",  # not an ending srun is known to print
    ]
    assert srun_task_exits(lines) == (
        TaskExit("node2", 1, signal=9, order=0),
        TaskExit("node1", 0, signal=15, order=1),
        TaskExit("node3", 4, exit_code=1, order=2),
        TaskExit("node3", 5, exit_code=1, order=3),
        TaskExit("node3", 7, exit_code=1, order=4),
        TaskExit("node4", 6, signal=11, order=5),
    )


def test_a_rank_killed_from_outside_is_blamed_on_its_own_node_not_the_first():
    # The agents cannot read a non-child's exit status: srun's line is the only word on the killed rank.
    from supervisor.decisions.classify import RankExit, classify
    from supervisor.driver import evidence
    from supervisor.driver.evidence import WatchResult

    log = ["0: step=23 loss=0.6", "srun: error: node2: task 1: Killed", "srun: error: node1: task 0: Terminated"]
    found = evidence.build(WatchResult("exited", exit_code=143), now=0.0, ranks=[], sigterm_flag=0, job=None,
                           job_known=True, nodes={}, log_lines=log, step_nodes=("node1", "node2"),
                           job_nodes=("node1", "node2"), signal_lead_s=60.0, scheduled_end=None)  # fmt: skip
    assert found.rank_exits == (RankExit("node2", 1, signal=9), RankExit("node1", 0, signal=15))
    got = classify(found)
    assert got.cls == "unknown" and got.blamed_nodes == ()
    assert got.evidence[0].startswith("rank 1 on node2 was killed by SIGKILL")


def test_address_book_full_names_win_over_short_ones_and_shared_addresses_name_nobody():
    from supervisor.decisions.tasklog import address_book

    book = address_book(["a.x", "a", "b.y.z"], {"c": "10.0.0.3", "d": "10.0.0.4", "e": "10.0.0.4", "f": "127.0.0.1"})
    assert book["a"] == "a" and book["a.x"] == "a.x" and book["b"] == "b.y.z" and book["b.y.z"] == "b.y.z"
    assert book["10.0.0.3"] == "c" and "10.0.0.4" not in book and "127.0.0.1" not in book
    plain = address_book([f"n{i:05d}" for i in range(16_384)])  # no dotted names: no short-name pass
    assert len(plain) == 16_384 and plain["n00042"] == "n00042"

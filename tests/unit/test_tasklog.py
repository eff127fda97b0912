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

"""crash-node's loss of the node's memory (slurm/localcluster/node_memory.py): exactly the crashed node's
supervisor directories go (node1 is not node11), with everything in them; links and other entries stay."""

from __future__ import annotations

from pathlib import Path

from slurm.localcluster.node_memory import wipe_node_memory


def test_only_the_crashed_nodes_directories_are_removed(tmp_path: Path) -> None:
    mine = tmp_path / "supervisor-12-0-abc-node1"
    (mine / "memory" / "step_5").mkdir(parents=True)
    (mine / "memory" / "step_5" / "rank_0.snap").write_bytes(b"x")
    other = tmp_path / "supervisor-12-0-abc-node11"
    other.mkdir()
    stranger = tmp_path / "someone-else-node1"
    stranger.mkdir()
    link = tmp_path / "supervisor-13-0-def-node1"
    link.symlink_to(other)
    assert wipe_node_memory("node1", tmp_path) == [str(mine)]
    assert not mine.exists() and other.is_dir() and stranger.is_dir() and link.is_symlink()
    assert wipe_node_memory("node9", tmp_path / "missing") == []

"""Node faults on demand: ``crash_node`` loses a node as a dead machine would, ``revive_node`` brings it back.

Why a module of its own: starting and stopping the cluster (the package's ``LocalCluster``) is one concept, and
taking one node down behind slurmctld's back for the node-loss tests is another, with its own rule: a crash is
marked in ROOT/run, so that ``up`` (another test session's fixture) leaves the node down for ``CRASH_HOLD_S``
instead of reviving it behind the back of the test that crashed it. ``LocalCluster`` inherits ``NodeFaults``, so
``cluster.crash_node(...)`` and ``python -m slurm.localcluster crash-node NODE`` are as before.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from slurm.localcluster import procs
from slurm.localcluster.config import Layout
from slurm.localcluster.errors import ClusterError
from slurm.localcluster.files import locked

# How long `up` leaves a node that crash-node took down alone (a test is probably still watching it).
CRASH_HOLD_S = 600.0


class _Cluster(Protocol):
    """What the faults need of the cluster they are mixed into (``LocalCluster``)."""

    layout: Layout

    @property
    def root(self) -> Path: ...

    @property
    def node_names(self) -> list[str]: ...

    def pid_of(self, name: str) -> int | None: ...

    def stepd_pids(self, node: str) -> set[int]: ...

    def _start(self, name: str, timeout: float) -> int: ...

    def _wait_nodes_usable(self, nodes: Iterable[str], deadline: float, restarted: set[str]) -> None: ...


def crash_marker(layout: Layout, node: str) -> Path:
    """The file whose presence (and age) says crash-node took ``node`` down."""
    return layout.run / f"crashed-{node}"


class NodeFaults:
    """``crash_node``, ``revive_node`` and ``crashed_nodes`` of ``LocalCluster`` (mixed in)."""

    def crashed_nodes(self: _Cluster) -> list[str]:
        """Nodes that crash-node took down less than CRASH_HOLD_S ago: ``up`` (e.g. another test session's
        fixture) must not revive them behind the back of the test that crashed them. Older marks are ignored, so a
        test that died before reviving its node does not keep the node down forever."""
        held = []
        for node in self.node_names:
            try:
                age = time.time() - crash_marker(self.layout, node).stat().st_mtime
            except FileNotFoundError:
                continue
            if age < CRASH_HOLD_S:
                held.append(node)
        return held

    def crash_node(self: _Cluster, name: str) -> dict[str, list[int]]:
        """Simulate losing node ``name``: SIGKILL its slurmd and its slurmstepds with their process trees, so the
        job tasks on it die as on a real crash. Returns {"slurmd": [...], "killed": [all pids killed]}."""
        _check_node(self, name)
        with locked(self.root, 30.0, ClusterError):
            return _crash_node(self, name)

    def revive_node(self: _Cluster, name: str, timeout: float = 60.0) -> bool:
        """Start node ``name``'s slurmd again if it is dead, resume the node if slurmctld marked it DOWN, and wait
        until it is usable. Returns True if a slurmd was started."""
        _check_node(self, name)
        with locked(self.root, timeout, ClusterError):
            return _revive_node(self, name, timeout)


def _check_node(cluster: _Cluster, name: str) -> None:
    if name not in cluster.node_names:
        raise ClusterError(f"unknown node {name!r} (fix: use one of {', '.join(cluster.node_names)})")


def _crash_node(cluster: _Cluster, name: str) -> dict[str, list[int]]:
    slurmd = cluster.pid_of(f"slurmd-{name}")
    roots = ([slurmd] if slurmd is not None else []) + sorted(cluster.stepd_pids(name))
    try:
        killed = procs.freeze_and_kill(roots)
    except RuntimeError as e:
        raise ClusterError(f"crash-node {name}: {e}") from e
    leftover = cluster.stepd_pids(name)
    if leftover:
        raise ClusterError(f"crash-node {name}: slurmstepd processes still alive: {sorted(leftover)}")
    crash_marker(cluster.layout, name).touch()
    return {"slurmd": [slurmd] if slurmd is not None else [], "killed": killed}


def _revive_node(cluster: _Cluster, name: str, timeout: float) -> bool:
    crash_marker(cluster.layout, name).unlink(missing_ok=True)
    deadline = time.monotonic() + timeout
    started = False
    if cluster.pid_of(f"slurmd-{name}") is None:
        cluster._start(f"slurmd-{name}", timeout)
        started = True
    cluster._wait_nodes_usable([name], deadline, restarted={name})
    return started

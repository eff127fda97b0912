"""The project's local Slurm cluster behaves like a real one: idempotent `up`, honest `status`, and a crashed node
is noticed by slurmctld, its requeueable job reruns elsewhere, and the node can be revived."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurm.localcluster import ClusterError, LocalCluster
from slurm.localcluster.config import (
    ClusterSpec,
    Layout,
    parse_version,
    render_cgroup_conf,
    render_slurm_conf,
    render_topology_conf,
)

REPO = Path(__file__).resolve().parents[2]


def cli(cluster: LocalCluster, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the contract entry point `python -m slurm.localcluster` against ``cluster``."""
    argv = [sys.executable, "-m", "slurm.localcluster", *args, "--root", str(cluster.root),
            "--base-port", str(cluster.spec.base_port), "--nodes", str(len(cluster.node_names))]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)


def busy_nodes(cluster: LocalCluster) -> set[str]:
    """Nodes that currently run or finish jobs of anyone (the cluster is shared with other tests)."""
    lists = cluster.slurm("squeue", "-h", "-t", "RUNNING,COMPLETING", "-o", "%N").stdout.split()
    nodes: set[str] = set()
    for hostlist in lists:
        nodes.update(cluster.slurm("scontrol", "show", "hostnames", hostlist).stdout.split())
    return nodes


def job_field(cluster: LocalCluster, job_id: str, field: str) -> str:
    line = cluster.slurm("scontrol", "show", "job", "-o", job_id).stdout
    for token in line.split():
        if token.startswith(field + "="):
            return token.split("=", 1)[1]
    raise AssertionError(f"no {field} in {line!r}")


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


# ----- pure parts (no cluster needed) -------------------------------------------------------------------------
def test_cgroup_conf_follows_the_slurm_version() -> None:
    assert parse_version("slurm-wlm 22.05.8") == (22, 5, 8)
    assert parse_version("slurm 24.11.5") == (24, 11, 5)
    assert "CgroupPlugin" not in render_cgroup_conf((22, 5, 8))
    assert "IgnoreSystemd=yes" in render_cgroup_conf((23, 11, 10))
    assert "CgroupPlugin=disabled" in render_cgroup_conf((24, 11, 5))


def test_slurm_conf_puts_every_node_on_its_own_port_under_root(tmp_path: Path) -> None:
    spec = ClusterSpec(layout=Layout(tmp_path), hostname="h1", user="root", base_port=20000, nodes=3)
    conf = render_slurm_conf(spec)
    assert "SlurmctldHost=h1(127.0.0.1)" in conf
    assert "SlurmctldPort=20000" in conf
    assert "NodeName=node[1-3] NodeHostname=h1 NodeAddr=127.0.0.1 Port=[20001-20003]" in conf
    assert f"AuthInfo=socket={tmp_path}/run/munge.socket,cred_expire=10" in conf
    for line in conf.splitlines():
        for word in line.split():
            if "=/" in word:  # every path the daemons write lives under ROOT
                path = "/" + word.split("=/", 1)[1]
                assert path.startswith(str(tmp_path)), line


def test_topology_puts_name_neighbours_on_one_switch_and_the_first_two_nodes_on_two(tmp_path: Path) -> None:
    """``--topology``: a ring by name (node2 -> node3) would pair nodes of one switch, and a job's batch host
    (node1) and second node are on different ones (tests/integration/test_memory_topology.py relies on both)."""
    spec = ClusterSpec(layout=Layout(tmp_path), hostname="h1", user="root", nodes=4, topology=True)
    assert "TopologyPlugin=topology/tree" in render_slurm_conf(spec)
    assert "TopologyPlugin" not in render_slurm_conf(ClusterSpec(layout=Layout(tmp_path), hostname="h1", user="root"))
    from slurm.parse_topology import parse_topology

    switch = parse_topology(render_topology_conf(spec))  # the same lines `scontrol show topology` prints
    assert switch == {"node1": "leaf0", "node4": "leaf0", "node2": "leaf1", "node3": "leaf1"}


@pytest.mark.slurm  # pid_of compares with the installed slurmctld program
def test_a_recorded_pid_that_is_not_our_daemon_counts_as_dead(tmp_path: Path) -> None:
    """A recycled pid (here: this pytest process) must not be mistaken for a live slurmctld."""
    cluster = LocalCluster(tmp_path, base_port=21000)
    cluster.layout.run.mkdir(parents=True)
    cluster.layout.pid_file("slurmctld").write_text(f"{os.getpid()}\n")
    assert cluster.pid_of("slurmctld") is None


def test_unknown_node_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ClusterError, match="unknown node 'node9'.*node1, node2"):
        LocalCluster(tmp_path, base_port=21000, nodes=2).crash_node("node9")


# ----- the real cluster --------------------------------------------------------------------------------------
@pytest.mark.slurm
def test_up_is_idempotent_and_status_reports_usable_nodes(slurm_cluster: LocalCluster) -> None:
    before = slurm_cluster.pids()
    assert all(before.values()), before
    assert slurm_cluster.up(timeout=30) == []
    assert slurm_cluster.pids() == before
    status = slurm_cluster.status()
    assert status["up"] is True
    assert set(status["nodes"]) == set(slurm_cluster.node_names)
    busy = busy_nodes(slurm_cluster)
    for node, state in status["nodes"].items():
        if node not in busy:
            assert state == "IDLE", (node, state)


@pytest.mark.slurm
def test_cli_up_starts_nothing_new_and_ends_with_the_export_line(slurm_cluster: LocalCluster) -> None:
    before = slurm_cluster.pids()
    res = cli(slurm_cluster, "up")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    # `export SLURM_CONF=...`, followed by PATH=<wrappers>:... when the cluster runs in the 24.11 chroot
    assert lines[-1].split()[:2] == ["export", f"SLURM_CONF={slurm_cluster.conf}"]
    assert (len(lines[-1].split()) == 2) == (slurm_cluster.chroot is None)
    assert not any(line.startswith("started") for line in lines), lines
    assert slurm_cluster.pids() == before
    status = cli(slurm_cluster, "status")
    assert status.returncode == 0, status.stdout
    assert f"cluster {slurm_cluster.root}: UP" in status.stdout


def quiet_nodes(cluster: LocalCluster, count: int) -> list[str]:
    """``count`` nodes, preferring ones without jobs: other test sessions share this cluster."""
    busy = busy_nodes(cluster)
    ordered = [n for n in reversed(cluster.node_names) if n not in busy] + [
        n for n in reversed(cluster.node_names) if n in busy]
    return ordered[:count]


@pytest.mark.slurm
def test_up_restarts_a_dead_slurmd_but_leaves_a_deliberately_crashed_node_down(
        crashable_cluster: LocalCluster) -> None:
    cluster = crashable_cluster
    died, crashed = quiet_nodes(cluster, 2)
    before = cluster.pids()
    victim_pid = before[f"slurmd-{died}"]
    assert victim_pid is not None
    os.kill(victim_pid, signal.SIGKILL)  # an unexpected death: `up` must heal it
    wait_for(lambda: cluster.pid_of(f"slurmd-{died}") is None, 10, f"slurmd of {died} to die")
    cluster.crash_node(crashed)  # a test's deliberate crash: another session's `up` must not undo it
    assert cli(cluster, "status").returncode != 0

    assert cluster.up(timeout=60) == [f"slurmd-{died}"]
    after = cluster.pids()
    assert after[f"slurmd-{died}"] not in (None, victim_pid)
    assert after[f"slurmd-{crashed}"] is None
    untouched = set(before) - {f"slurmd-{died}", f"slurmd-{crashed}"}
    assert {k: after[k] for k in untouched} == {k: before[k] for k in untouched}
    assert cluster.revive_node(crashed, timeout=60) is True
    assert cluster.status()["up"] is True


JOB = """#!/bin/bash
srun bash -c 'echo $$ > {dir}/task.$SLURMD_NODENAME.${{SLURM_RESTART_COUNT:-0}}; exec sleep 600'
"""


@pytest.mark.slurm
def test_crashed_node_requeues_its_job_elsewhere_and_revives(crashable_cluster: LocalCluster,
                                                             tmp_path: Path) -> None:
    cluster = crashable_cluster
    script = tmp_path / "job.sh"
    script.write_text(JOB.format(dir=tmp_path))
    # --exclusive: the node we crash runs nothing of other test sessions sharing this cluster
    job = cluster.slurm("sbatch", "--parsable", "-N2", "--exclusive", "--requeue", "-J", "lc-crash-test",
                        "-o", str(tmp_path / "out.txt"), str(script)).stdout.strip()
    try:
        wait_for(lambda: len(list(tmp_path.glob("task.*.0"))) == 2, 90, "both tasks of the first run")
        nodes = sorted(p.name.split(".")[1] for p in tmp_path.glob("task.*.0"))
        batch_host = job_field(cluster, job, "BatchHost")
        victim = next(n for n in nodes if n != batch_host)  # lose a compute node, not the batch host
        task_pid = int((tmp_path / f"task.{victim}.0").read_text())

        res = cli(cluster, "crash-node", victim)
        assert res.returncode == 0, res.stderr
        assert not Path(f"/proc/{task_pid}").exists() or "Z" in Path(f"/proc/{task_pid}/stat").read_text().split()[2]
        assert cluster.stepd_pids(victim) == set()

        assert "NOT_RESPONDING" in cluster.wait_node_state(victim, {"NOT_RESPONDING"}, timeout=30)
        assert "DOWN" in cluster.wait_node_state(victim, {"DOWN"}, timeout=30)
        rerun = wait_for(lambda: list(tmp_path.glob("task.*.1")), 120, "the requeued run's tasks", interval=1)
        assert victim not in {p.name.split(".")[1] for p in rerun}
        assert job_field(cluster, job, "Restarts") == "1"
        assert job_field(cluster, job, "JobState") == "RUNNING"

        res = cli(cluster, "revive-node", victim)
        assert res.returncode == 0, res.stderr
        assert cluster.is_usable(cluster.node_states()[victim])
    finally:
        cluster.slurm("scancel", job, check=False)


def free_port_range(count: int, start: int = 20000, stop: int = 30000) -> int:
    """First port P such that P..P+count-1 are all free on this host (other developers run clusters too)."""
    for base in range(start, stop, count):
        try:
            socks = []
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("0.0.0.0", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


@pytest.mark.slurm
def test_fresh_cluster_with_accounting_from_nothing_to_down() -> None:
    """A brand-new ROOT comes up (private munge key, 0700 secrets), sacct sees a finished job, and `down` leaves
    no daemon of that cluster behind."""
    if LocalCluster("/nonexistent", nodes=1).chroot is not None:
        pytest.skip("accounting (slurmdbd + MariaDB) is not carried by the Slurm 24.11 chroot: "
                    "see docs/local-cluster.md")
    root = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))  # short: unix socket paths must fit in 108 bytes
    cluster = LocalCluster(root, base_port=free_port_range(2 + 3), nodes=2, accounting=True)
    try:
        started = cluster.up(timeout=120)
        assert set(started) == {"munged", "mariadbd", "slurmdbd", "slurmctld", "slurmd-node1", "slurmd-node2"}
        assert stat.S_IMODE(cluster.layout.munge_key.stat().st_mode) == 0o600
        assert cluster.layout.munge_key.stat().st_size == 1024
        for secret_dir in (cluster.layout.munge_dir, cluster.layout.state, root / "db"):
            assert stat.S_IMODE(secret_dir.stat().st_mode) == 0o700, secret_dir
        assert stat.S_IMODE((root / "etc" / "slurmdbd.conf").stat().st_mode) == 0o600

        job = cluster.slurm("sbatch", "--parsable", "-N2", "--wrap", "srun true").stdout.strip()
        wait_for(lambda: "COMPLETED" in cluster.slurm("sacct", "-n", "-X", "-j", job, "-o", "State").stdout,
                 60, f"sacct to show job {job} COMPLETED")

        pids = cluster.pids()
        assert cluster.down() == sorted(pids)
        assert all(pid is None for pid in cluster.pids().values())
        for pid in pids.values():
            assert pid is not None and not procs_alive(pid)
        assert cluster.status()["up"] is False
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slurm
def test_a_port_taken_by_another_program_is_one_clear_error() -> None:
    root = Path(tempfile.mkdtemp(prefix="lc-", dir="/tmp"))
    base = free_port_range(2)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", base + 1))  # node1's slurmd port
    blocker.listen()
    cluster = LocalCluster(root, base_port=base, nodes=1)
    try:
        with pytest.raises(ClusterError, match=f"port {base + 1} needed by slurmd-node1 is already in use.*--base-port"):
            cluster.up(timeout=30)
    finally:
        blocker.close()
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


def procs_alive(pid: int) -> bool:
    """Alive and not a zombie (init may reap late here)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


@given(nodes=st.integers(min_value=1, max_value=64), base=st.integers(min_value=1024, max_value=60000))
def test_node_ports_are_distinct_consecutive_and_clear_of_slurmctld(nodes: int, base: int) -> None:
    spec = ClusterSpec(layout=Layout(Path("/c")), hostname="h", user="root", base_port=base, nodes=nodes)
    ports = [spec.node_port(n) for n in spec.node_names]
    assert ports == list(range(base + 1, base + nodes + 1))
    assert spec.ctld_port not in ports and spec.dbd_port not in ports and spec.db_port not in ports
    node_line = next(line for line in render_slurm_conf(spec).splitlines() if "NodeAddr" in line)
    expected = f"Port={base + 1}" if nodes == 1 else f"Port=[{base + 1}-{base + nodes}]"
    assert node_line.endswith(expected)

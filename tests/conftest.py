"""Shared fixtures: the real local Slurm cluster (slurm/localcluster) for tests marked ``slurm``.

The cluster is left running after the session so re-runs start in under a second; set
SUPERVISOR_CLUSTER_TEARDOWN=1 to stop it at the end. SUPERVISOR_CLUSTER_DIR and SUPERVISOR_CLUSTER_BASE_PORT
select another cluster (e.g. a private one on other ports); SUPERVISOR_CLUSTER_SLURM=24 runs Debian 13's Slurm 24.11
(`make test-slurm24`), =26 Debian sid's 26.05 (`make test-slurm26`). A machine that cannot run Slurm makes these tests
FAIL, never skip: CI must not pass without talking to a real slurmctld.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from slurm.localcluster import ClusterError, LocalCluster
from slurm.localcluster.config import DEFAULT_BASE_PORT

CLUSTER_UP_TIMEOUT_S = 120.0


def _base_port() -> int:
    return int(os.environ.get("SUPERVISOR_CLUSTER_BASE_PORT", DEFAULT_BASE_PORT))


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[LocalCluster]:
    """The local cluster, up with every node usable; os.environ["SLURM_CONF"] points at it for the session."""
    cluster = LocalCluster(base_port=_base_port())
    try:
        cluster.up(timeout=CLUSTER_UP_TIMEOUT_S)
    except ClusterError as e:
        pytest.fail(f"the local Slurm cluster could not be started ({e}); these tests need a real Slurm: run as "
                    "root, or install the packages as `python -m slurm.localcluster up` explains", pytrace=False)
    # SLURM_CONF, and PATH to the client wrappers when the cluster runs in a chroot (SUPERVISOR_CLUSTER_SLURM=24 or 26).
    previous = {key: os.environ.get(key) for key in cluster.env}
    os.environ.update(cluster.env)
    yield cluster
    for key, value in previous.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    if os.environ.get("SUPERVISOR_CLUSTER_TEARDOWN") == "1":
        cluster.down()


@pytest.fixture(autouse=True)
def _slurm_marker_brings_cluster_up(request: pytest.FixtureRequest) -> None:
    """A test marked ``slurm`` gets the cluster even if it does not ask for the fixture by name."""
    if request.node.get_closest_marker("slurm") is not None:
        request.getfixturevalue("slurm_cluster")


@pytest.fixture
def crashable_cluster(slurm_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The cluster for a test that crashes nodes or slurmctld: at teardown every node is revived and usable
    again (a node slurmctld drained, e.g. for a "Duplicate jobid" after it lost state, is resumed), so later tests
    find all nodes idle."""
    yield slurm_cluster
    problems = []
    for node in slurm_cluster.node_names:
        try:
            state = slurm_cluster.node_states().get(node, "MISSING")
            if "DRAIN" in state.split("+"):
                slurm_cluster.slurm("scontrol", "update", f"nodename={node}", "state=resume", check=False)
            if slurm_cluster.pid_of(f"slurmd-{node}") is None or not slurm_cluster.is_usable(state):
                slurm_cluster.revive_node(node, timeout=60)
        except (ClusterError, TimeoutError) as e:
            problems.append(f"{node}: {e}")
    if problems:
        pytest.fail("could not revive nodes after the test: " + "; ".join(problems), pytrace=False)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's headless ``chromium``, installed when missing (as root): the pages users open are checked in a
    real browser. A machine that cannot provide it makes those tests fail, never skip."""
    from slurm.localcluster.install import InstallError, ensure_packages, find_program

    log: list[str] = []
    try:
        ensure_packages(["chromium"], ["chromium"], log, what="browser")
    except InstallError as e:
        pytest.fail(f"headless chromium is needed to check the HTML pages: {e}", pytrace=False)
    found = find_program("chromium")
    assert found is not None
    return str(found)

"""The local cluster's simulated reboot (slurm/localcluster/reboot.py): the RebootProgram finds its node on the
slurmd command line above it, and the fresh boot clock counts from the host's boot even when the program itself
runs in a namespace an earlier reboot made (else the second reboot of a node would report an old boot time and
Slurm would never complete it). The reboot itself runs on the real cluster: tests/integration/test_site_repair.py."""

from __future__ import annotations

import os
import subprocess

import pytest

from slurm.localcluster.reboot import calling_node, host_uptime, node_of


def test_the_node_is_read_from_a_slurmd_command_line() -> None:
    assert node_of(b"/usr/sbin/slurmd\0-f\0/x/slurm.conf\0-N\0node3\0") == "node3"
    assert node_of(b"/bin/sh\0-c\0/x/reboot.sh\0") is None
    assert node_of(b"slurmd\0-N") is None  # a flag without its value


def test_a_process_not_under_a_slurmd_has_no_node() -> None:
    assert calling_node(os.getpid()) is None


def test_the_host_uptime_adds_back_this_namespaces_offset() -> None:
    assert host_uptime("69432.65 116204.66\n", None) == 69432.65
    offsets = "monotonic           0         0\nboottime          -50         0\n"
    assert host_uptime("69432.65 116204.66\n", offsets) == pytest.approx(69482.65)
    assert host_uptime("12.5 3.0", "boottime 100 500000000\n") == pytest.approx(-88.0)


def test_the_offset_read_inside_a_namespace_matches_the_hosts_clock() -> None:
    """Measured, not assumed: a shell in a namespace 1000 s ahead of the host reads the host's uptime back. (Ahead,
    not behind: a machine up for less than 1000 s refuses a negative offset that large.)"""
    if os.geteuid() != 0:
        pytest.skip("creating a time namespace needs root")
    inside = subprocess.run(["unshare", "--time", "--boottime=1000", "sh", "-c",
                             "cat /proc/uptime; echo ---; cat /proc/self/timens_offsets"],
                            capture_output=True, text=True, timeout=30, check=True).stdout  # fmt: skip
    uptime, offsets = inside.split("---\n")
    with open("/proc/uptime") as f:
        host = float(f.read().split()[0])
    assert abs(host_uptime(uptime, offsets) - host) < 5

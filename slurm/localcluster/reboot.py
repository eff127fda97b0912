"""A node reboot on the local cluster, where every node is one host's slurmd (``LocalCluster.reboot_node``).

slurmctld counts a ``scontrol reboot`` as done when the node's slurmd registers with a boot time after the
request; every slurmd here shares the host's boot time. So the rebooted node's slurmd is started in a new time
namespace (Linux >= 5.6, ``unshare --time``) whose boot clock is offset to read under one second: it reports a
boot time of now, and Slurm completes the reboot and its ``nextstate`` as after a real one.

Run as Slurm's ``RebootProgram`` (``python -m slurm.localcluster.reboot --root ROOT --base-port PORT``), it reads
its node from the slurmd that started it (``slurmd -N NODE``, through a shell), hands the reboot to a detached
``python -m slurm.localcluster reboot-node NODE`` (that process kills the slurmd, so it must not be its child)
and returns at once, as a real RebootProgram's ``reboot`` call would.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from slurm.localcluster.errors import ClusterError
from slurm.localcluster.install import find_program


def host_uptime(uptime: str, offsets: str | None) -> float:
    """Seconds since the host booted from this process's /proc/uptime and /proc/self/timens_offsets (None: no
    time namespaces). A slurmd this module rebooted runs its RebootProgram in its own namespace, where
    /proc/uptime is offset; a new namespace's offsets count from the host's clock, so the offset is added back."""
    seconds = float(uptime.split()[0])
    for line in (offsets or "").splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "boottime":
            return seconds - int(words[1]) - int(words[2]) / 1e9
    return seconds


def fresh_boot() -> list[str]:
    """The argument list that runs a program with a boot clock that reads under one second."""
    unshare = find_program("unshare")
    if unshare is None:
        raise ClusterError("reboot-node needs unshare (fix: apt-get install util-linux)")
    try:
        offsets: str | None = Path("/proc/self/timens_offsets").read_text()
    except OSError:
        offsets = None
    return [str(unshare), "--time", f"--boottime={-int(host_uptime(Path('/proc/uptime').read_text(), offsets))}"]


def node_of(cmdline: bytes) -> str | None:
    """The node of a ``slurmd ... -N NODE ...`` command line (/proc/PID/cmdline), or None."""
    words = [w.decode(errors="replace") for w in cmdline.split(b"\0")]
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "-N":
            return value
    return None


def calling_node(pid: int, levels: int = 6) -> str | None:
    """The node of the nearest ``slurmd -N NODE`` among ``pid``'s ancestors (slurmd runs its RebootProgram
    through ``system()``: a shell sits between them), or None."""
    for _ in range(levels):
        try:
            node = node_of(Path(f"/proc/{pid}/cmdline").read_bytes())
            if node is not None:
                return node
            stat = Path(f"/proc/{pid}/stat").read_text()
            pid = int(stat[stat.rindex(")") + 2:].split()[1])  # the field after the state: the parent's pid
        except (OSError, ValueError, IndexError):
            return None
        if pid <= 1:
            return None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurm.localcluster.reboot", description=__doc__)
    parser.add_argument("--root", required=True)
    parser.add_argument("--base-port", required=True, type=int)
    args = parser.parse_args(argv)
    node = calling_node(os.getppid())
    if node is None:
        print("localcluster reboot: not started by a slurmd -N NODE", file=sys.stderr)
        return 1
    log = open(Path(args.root) / "log" / f"reboot-{node}.log", "ab")  # noqa: SIM115 - handed to the child
    subprocess.Popen([sys.executable, "-m", "slurm.localcluster", "reboot-node", node, "--delay", "1", "--root",
                      args.root, "--base-port", str(args.base_port)], stdin=subprocess.DEVNULL, stdout=log,
                     stderr=log, start_new_session=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

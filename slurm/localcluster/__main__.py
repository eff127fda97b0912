"""``python -m slurm.localcluster up|down|status|crash-node NODE|revive-node NODE|reboot-node NODE`` (contract).

``up`` ends by printing ``export SLURM_CONF=<ROOT>/etc/slurm.conf`` as its last line of stdout, so
``eval "$(python -m slurm.localcluster up | tail -n1)"`` points the shell at the cluster. With ``--slurm 24`` (or
``26``) on a host that needs a Debian chroot, that line also puts the cluster's client wrappers first on PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence

from slurm.localcluster import SLURM_CHOICES, ClusterError, LocalCluster, default_root, default_slurm
from slurm.localcluster.config import DEFAULT_BASE_PORT, DEFAULT_NODES


def _add_common(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The options are accepted before or after the command; after it, they must not reset the values given
    before it to their defaults (an argparse pitfall), hence SUPPRESS defaults on the subcommands."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--root", default=default(None),
                        help=f"cluster directory (default: $SUPERVISOR_CLUSTER_DIR or {default_root()})")
    # A string default goes through type=int like a typed value, so a bad $SUPERVISOR_CLUSTER_BASE_PORT is
    # argparse's one-line error; the env var is the one the tests and the demo read, so all three agree.
    parser.add_argument("--base-port", type=int,
                        default=default(os.environ.get("SUPERVISOR_CLUSTER_BASE_PORT") or str(DEFAULT_BASE_PORT)),
                        help="slurmctld port P; slurmd use P+1..P+N "
                             f"(default $SUPERVISOR_CLUSTER_BASE_PORT or {DEFAULT_BASE_PORT})")
    parser.add_argument("--nodes", type=int, default=default(DEFAULT_NODES),
                        help=f"number of nodes (default {DEFAULT_NODES})")
    parser.add_argument("--accounting", action="store_true", default=default(False),
                        help="also run slurmdbd + MariaDB so that sacct works (installs them if missing)")
    parser.add_argument("--topology", action="store_true", default=default(None),
                        help="two leaf switches under one spine (topology/tree; node1,node4 | node2,node3 ...); "
                             "default $SUPERVISOR_CLUSTER_TOPOLOGY=1")
    parser.add_argument("--timeout", type=float, default=default(60.0), help="seconds to wait (default 60)")
    parser.add_argument("--slurm", choices=SLURM_CHOICES, default=default(None),
                        help="which Slurm: the host's packages, Debian 13's 24.11 or sid's 26.05 (in a chroot unless "
                             "the host's own packages are that version); default $SUPERVISOR_CLUSTER_SLURM or system")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _add_common(common, suppress=True)
    parser = argparse.ArgumentParser(prog="python -m slurm.localcluster",
                                     description="A real multi-node Slurm cluster on this host, under one directory.")
    _add_common(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    sub.add_parser("up", parents=[common], help="start what is not running; wait until all nodes are usable")
    sub.add_parser("down", parents=[common], help="stop the daemons this cluster recorded (and leftover job steps)")
    p = sub.add_parser("status", parents=[common], help="daemons and node states; exit 0 only if all is up")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p = sub.add_parser("crash-node", parents=[common], help="SIGKILL a node's slurmd and its job steps")
    p.add_argument("node")
    p = sub.add_parser("revive-node", parents=[common], help="restart a node's slurmd and resume it")
    p.add_argument("node")
    p = sub.add_parser("reboot-node", parents=[common],
                       help="what a reboot does: the node's processes and memory lost, its slurmd back freshly booted")
    p.add_argument("node")
    p.add_argument("--delay", type=float, default=0.0, help="wait this long first (the RebootProgram's exit)")
    return parser


def _print_status(st: dict) -> None:
    print(f"cluster {st['root']}: {'UP' if st['up'] else 'NOT UP'}")
    for name, pid in st["daemons"].items():
        print(f"  {name:<16} {'pid ' + str(pid) if pid else 'not running'}")
    for node, state in st["nodes"].items():
        print(f"  {node:<16} {state}")
    if st.get("error"):
        print(f"  error: {st['error']}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cluster = LocalCluster(args.root, base_port=args.base_port, nodes=args.nodes, accounting=args.accounting,
                               slurm=args.slurm or default_slurm(), topology=args.topology or None)
        if args.command == "up":
            try:
                cluster.up(timeout=args.timeout)
            finally:
                for line in cluster.log:
                    print(line)
            exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in cluster.env.items())
            print(f"export {exports}")
        elif args.command == "down":
            cluster.down(timeout=args.timeout)
            for line in cluster.log:
                print(line)
        elif args.command == "status":
            st = cluster.status()
            if args.json:
                print(json.dumps(st, indent=2))
            else:
                _print_status(st)
            return 0 if st["up"] else 3
        elif args.command == "crash-node":
            killed = cluster.crash_node(args.node)
            print(f"crashed {args.node}: slurmd {killed['slurmd'] or 'was not running'}, "
                  f"{len(killed['killed'])} process(es) killed: {killed['killed']}; memory lost: "
                  f"{', '.join(killed['wiped']) or 'none held'}")
        elif args.command == "reboot-node":
            if args.delay > 0:
                import time

                time.sleep(min(args.delay, 60.0))
            cluster.reboot_node(args.node, timeout=args.timeout)
            print(f"{args.node}: rebooted (slurmd started with a fresh boot time)")
        elif args.command == "revive-node":
            started = cluster.revive_node(args.node, timeout=args.timeout)
            state = cluster.node_states().get(args.node)
            print(f"{args.node}: {'slurmd started' if started else 'slurmd already running'}, state {state}")
    except ClusterError as e:
        print(f"localcluster: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``supervise healthcheck``: is this node fit to train? Exit 8 when it is not.

Run it on a node (``srun -N4 --ntasks-per-node=1 supervise healthcheck``) or as Slurm's HealthCheckProgram with
``--drain``: the node is drained with ``reason="supervise: <check> <value> (threshold <t>)"`` when a check fails
and resumed when it passes again, only if this command drained it. Every reading runs under a deadline and the
whole command under ``--timeout`` (default 45 s), well within the 60 s Slurm gives a HealthCheckProgram.
See docs/health.md for each check, its threshold and its source.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from supervisor.errors import SupervisorError

HELP = "check this node's health (GPUs, Xids, filesystems, memory, /dev/shm); exit 8 when unfit; --drain for Slurm"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print readings and problems as JSON")
    parser.add_argument("--expect-gpus", type=int, default=None,
                        help="GPUs this node must show (default: $SLURM_GPUS_ON_NODE when set)")  # fmt: skip
    parser.add_argument("--fs", action="append", default=[], metavar="ROLE=PATH",
                        help="a filesystem to check for free space and inodes, e.g. checkpoint=/scratch/ckpt "
                             "(repeatable)")  # fmt: skip
    parser.add_argument("--limit", action="append", default=[], metavar="KEY=VALUE",
                        help="override a threshold, e.g. fs_min_free_gib=50 (see docs/health.md)")  # fmt: skip
    parser.add_argument("--drain", action="store_true",
                        help="operator mode (HealthCheckProgram): drain this node when unfit, resume it when fit "
                             "again if this command drained it")  # fmt: skip
    parser.add_argument("--site-url", default=None, metavar="URL",
                        help="with --drain: tell the site ledger (docs/site.md) each time this drains the node")
    parser.add_argument("--site-token-file", default=None, metavar="FILE",
                        help="the token file `supervise site token` wrote for the health checks")
    parser.add_argument("--node", default=None, help="this node's Slurm name (default: $SLURMD_NODENAME or hostname)")
    parser.add_argument("--timeout", type=float, default=45.0, help="give up after this many seconds (default 45)")


def _filesystems(pairs: list[str]) -> dict[str, str]:
    from supervisor.errors import UsageError

    out: dict[str, str] = {}
    for pair in pairs:
        role, sep, path = pair.partition("=")
        if not sep or not role or not path:
            raise UsageError(f"--fs {pair!r} is not ROLE=PATH", "e.g. --fs checkpoint=/scratch/ckpt")
        out[role] = path
    return out


def run(args: argparse.Namespace) -> int:
    from slurm.errors import SlurmUnavailable
    from supervisor.errors import EXIT_SLURM_UNAVAILABLE, HealthCheckFailed, UsageError
    from supervisor.health.checks import Limits, evaluate, fit
    from supervisor.health.reading import node_name, read_node

    if not 1 <= args.timeout <= 300:
        raise UsageError(f"--timeout {args.timeout:g} is out of range", "use 1 to 300 seconds (Slurm allows 60)")
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(int(args.timeout))  # the last resort: a reading stuck in the kernel cannot hold Slurm's slot
    try:
        limits = Limits.from_pairs(args.limit)
    except ValueError as err:
        raise UsageError(str(err), "see docs/health.md for the thresholds") from None
    expected = args.expect_gpus
    if expected is None and os.environ.get("SLURM_GPUS_ON_NODE", "").isdigit():
        expected = int(os.environ["SLURM_GPUS_ON_NODE"])
    if (args.site_url is None) != (args.site_token_file is None) or (args.site_url and not args.drain):
        raise UsageError("--site-url and --site-token-file go together, with --drain",
                         "e.g. --drain --site-url http://admin1:8787 --site-token-file /etc/supervise/health.token")
    node = args.node or node_name()
    reading = read_node(expected, _filesystems(args.fs), node=node, timeout_s=min(20.0, args.timeout / 3))
    problems = evaluate(reading, limits)
    drain_doc = None
    drain_error: SupervisorError | None = None
    if args.drain:
        drain_doc, drain_error = _drain(node, problems, args.timeout)
        if args.site_url and drain_doc and drain_doc.get("action") == "drain":
            _tell_site(args, node, problems)
    if args.json:
        print(json.dumps({"reading": dataclasses.asdict(reading), "fit": fit(problems), "drain": drain_doc,
                          "problems": [dataclasses.asdict(p) for p in problems]}, indent=2, default=str))  # fmt: skip
    else:
        gpus = f"{len(reading.gpus)} GPUs" if reading.nvml == "ok" else reading.nvml
        print(f"node {reading.node}: /dev/shm {'writable' if reading.shm_writable else 'NOT writable'}, "
              f"{reading.shm_free_bytes >> 20} MiB free; {gpus}")
        for p in problems:
            print(f"{p.severity.upper():5} {p.what} (fix: {p.fix})")
        if drain_doc:
            print(f"slurm: {drain_doc['action']} {node}: {drain_doc['reason']}")
    if drain_error is not None:
        if isinstance(drain_error, SlurmUnavailable) or args.json:
            print(drain_error.one_line())
            return EXIT_SLURM_UNAVAILABLE
        raise drain_error
    if not fit(problems):
        if args.json:
            return HealthCheckFailed.exit_code
        first = next(p for p in problems if p.severity == "fatal")
        raise HealthCheckFailed(f"node {reading.node} is unfit: {first.what}", first.fix)
    return 0


def _tell_site(args: argparse.Namespace, node: str, problems: list) -> None:  # type: ignore[type-arg]
    """One verdict, read from the node, when this run drained it (once per episode: not every interval while it
    stays unfit, which would count one fault as many for the lemon rule). A site that cannot be told is a note on
    stderr: the drain stands, and the next drain tells it."""
    import sys

    from supervisor.decisions.site_source import healthcheck_verdict
    from supervisor.errors import SupervisorError
    from supervisor.site.client import SiteClient, read_token_file

    found = healthcheck_verdict(problems)
    if found is None:
        return
    klass, evidence = found
    try:
        client = SiteClient(args.site_url, read_token_file(args.site_token_file), timeout_s=min(10.0, args.timeout / 4))
        client.post_verdict(node=node, source="node", klass=klass, confidence=1.0, evidence=evidence,
                            job="healthcheck", campaign=f"healthcheck@{node}")  # fmt: skip
    except SupervisorError as err:
        print(f"site: not told ({err.one_line()})", file=sys.stderr)


def _drain(node: str, problems: list, timeout_s: float) -> tuple[dict | None, SupervisorError | None]:
    """Read the node's state, decide, act; (what was done, or None; the Slurm error, or None)."""
    from slurm.client import get_client
    from slurm.retry import RetryPolicy
    from supervisor.errors import SupervisorError
    from supervisor.health.drain import apply, decide

    budget = max(2.0, min(15.0, timeout_s / 3))
    client = get_client("cli", policy=RetryPolicy(budget_s=budget, call_timeout_s=budget))
    try:
        decision = decide(node, client.node(node), problems)
        apply(client, decision)
    except SupervisorError as err:  # unknown state: nothing drained or resumed on a failed query
        return None, err
    return dataclasses.asdict(decision), None

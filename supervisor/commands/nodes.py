"""``supervise nodes CAMPAIGN [--json] [--forgive NODE]``: the suspect-node ledger of a campaign.

Shows each node's strike score (decaying with the ledger's half-life), whether it is excluded on requeue,
and why it was struck. ``--forgive NODE`` journals an operator's pardon, clearing the node's score.
"""

from __future__ import annotations

import argparse
import json
import time

HELP = "show the suspect-node ledger (strikes, exclusions) of a campaign"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("campaign", metavar="CAMPAIGN", help="campaign directory")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--forgive", metavar="NODE", action="append", default=[],
                        help="clear a node's strikes (an operator checked it); may be repeated")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from slurm.hostlist import validate_node_name
    from supervisor import campaign, config, journal
    from supervisor.decisions import campaign_state
    from supervisor.decisions import events as ev

    paths, spec = campaign.load(args.campaign)
    ledger_config = config.from_mapping(spec.config, str(paths.spec)).ledger
    now = time.time()
    if args.forgive:
        with journal.Journal(paths.journal) as writer:
            for node in args.forgive:
                writer.append(ev.node_forgiven(now, validate_node_name(node)))
    events = journal.read(paths.journal) if paths.journal.exists() else []
    rows = campaign_state.fold(events, ledger_config).ledger.table(now)
    if args.json:
        print(json.dumps({"campaign": str(paths.root), "threshold": ledger_config.threshold,
                          "half_life_s": ledger_config.half_life_s, "nodes": rows}, indent=2))  # fmt: skip
        return 0
    if not rows:
        print("no suspect nodes")
        return 0
    print(f"{'NODE':<16} {'SCORE':>7} {'STRIKES':>7} {'EXCLUDED':>8}  LAST REASON")
    for row in rows:
        print(f"{row['node']:<16} {row['score']:>7.2f} {row['strikes']:>7} {'yes' if row['excluded'] else 'no':>8}  "
              f"{row['last_reason']}")
    return 0

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
        forgiven = [validate_node_name(node) for node in args.forgive]
        with journal.Journal(paths.journal) as writer:
            for node in forgiven:
                writer.append(ev.node_forgiven(now, node))
    events = journal.read(paths.journal) if paths.journal.exists() else []
    if args.forgive:
        print(let_back_in(campaign_state.fold(events, ledger_config).job_id, forgiven))
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


def let_back_in(job_id: str | None, nodes: list[str]) -> str:
    """Take forgiven nodes out of the campaign's job's ExcNodeList, where an earlier requeue wrote them (otherwise
    a held or pending job could still never start on them); one line saying what was done, or why not."""
    from slurm.client import get_client
    from slurm.errors import SlurmError

    pardoned = f"{', '.join(nodes)} forgiven"
    if job_id is None:
        return f"{pardoned} (no Slurm job is known for this campaign yet)"
    try:
        slurm = get_client()
        job = slurm.job(job_id)
        if job is None or job.is_finished:
            return f"{pardoned}; job {job_id} has ended: a resubmitted job will not exclude them"
        listed = [n for n in job.excluded_nodes if n in set(nodes)]
        if not listed:
            return f"{pardoned}; job {job_id} does not exclude them"
        if not job.is_pending:
            return (f"{pardoned} in the ledger; job {job_id} still lists {', '.join(listed)} in its ExcNodeList, "
                    "which Slurm changes only while the job is pending: run this again then")  # fmt: skip
        slurm.update_excluded_nodes(job_id, [n for n in job.excluded_nodes if n not in set(nodes)])
    except SlurmError as err:
        return (f"{pardoned} in the ledger, but job {job_id}'s ExcNodeList was not changed ({err}); "
                f"run `scontrol update JobId={job_id} ExcNodeList=...` without them")  # fmt: skip
    held = "; the job is held: `scontrol release " + job_id + "` lets it start" if job.is_held else ""
    return f"{pardoned}; {', '.join(listed)} taken out of job {job_id}'s ExcNodeList{held}"

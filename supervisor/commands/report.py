"""``supervise report CAMPAIGN [--json]``: attempts, outcomes, excluded nodes, checkpoints and goodput."""

from __future__ import annotations

import argparse
import json
import time

HELP = "report a campaign: attempts and their outcomes, exclusions, checkpoints, goodput"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("campaign", metavar="CAMPAIGN", help="campaign directory")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (the contract's fields)")
    parser.add_argument("--plot", metavar="FILE.html", help="also write a timeline of the attempts and the goodput")


def run(args: argparse.Namespace) -> int:
    from supervisor import campaign, journal, report

    paths, _ = campaign.load(args.campaign)
    events = journal.read(paths.journal) if paths.journal.exists() else []
    doc = report.fold(events, now=time.time())
    if doc["campaign"] is None:
        doc["campaign"] = str(paths.root)
    if args.plot:
        _plot(doc, args.plot)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(report.render_text(doc))
    return 0


def _plot(doc: dict, target: str) -> None:
    from pathlib import Path

    from supervisor.errors import UsageError
    from supervisor.plot import render_html

    path = Path(target)
    if path.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"cannot plot to {target}: only HTML is built in",
                         "give a FILE.html (a self-contained page; no plotting library needed)")  # fmt: skip
    try:
        path.write_text(render_html(doc, now=time.time()))
    except OSError as err:
        raise UsageError(f"cannot write {target}: {err.strerror}", "pick a writable path") from None

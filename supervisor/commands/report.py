"""``supervise report CAMPAIGN [--json]``: attempts, outcomes, excluded nodes, checkpoints and goodput."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

HELP = "report a campaign: attempts and their outcomes, exclusions, checkpoints, goodput"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("campaign", metavar="CAMPAIGN", help="campaign directory")
    parser.add_argument("--json", action="store_true", help="print the report as JSON (the contract's fields)")
    parser.add_argument("--plot", metavar="FILE", help="also draw the campaign's timeline: FILE.html (built in), "
                        "FILE.png or FILE.svg (need matplotlib: pip install 'slurm-supervisor[plot]')")


def run(args: argparse.Namespace) -> int:
    from supervisor import campaign, journal, report_view
    from supervisor.decisions import campaign_state
    from supervisor.plot.timeline import TimelineView

    paths, _ = campaign.load(args.campaign)
    events = journal.read(paths.journal) if paths.journal.exists() else []
    view = TimelineView()  # the picture's view, fed by the same one fold as the report
    now = time.time()
    doc = campaign_state.fold(events, views=(view,) if args.plot else ()).report(now)
    if doc["campaign"] is None:
        doc["campaign"] = str(paths.root)
    if args.plot:
        _plot(view.timeline(now, doc.get("goodput")), doc, args.plot)
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(report_view.render_text(doc))
    return 0


def _plot(tl: Any, doc: dict, target: str) -> None:
    from supervisor.errors import UsageError
    from supervisor.plot import PlotError, write_timeline

    try:
        write_timeline(tl, target, str(doc.get("campaign") or ""))
    except PlotError as err:
        raise UsageError(err.problem, err.fix) from None

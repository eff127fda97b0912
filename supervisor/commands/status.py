"""``supervise status CAMPAIGN [--json] [--watch]``: the live per-rank / per-node table of a running campaign.

``--watch`` redraws it in place (rich, the optional ``watch`` extra; plain text without it) every
``--interval`` seconds until the campaign ends: exit 0 when it completed, 1 when it failed or was stopped.

Reads ``live.json``, which the supervisor's aggregator atomically rewrites about once a second, so this
command never talks to the job, never needs the secret, and is cheap to run in a ``watch`` loop.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from supervisor import paths
from supervisor.errors import CampaignError

HELP = "show the live state of a campaign"
LIVE_NAME = paths.LIVE_NAME  # written by supervisor.heartbeat.live
STALE_AFTER_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("campaign", metavar="CAMPAIGN", help="campaign directory (printed by `supervise submit`)")
    parser.add_argument("--json", action="store_true", help="print the live status as JSON")
    parser.add_argument("--watch", action="store_true", help="refresh a live table until the campaign ends")
    parser.add_argument("--interval", type=float, default=2.0, help="--watch refresh period in seconds (default 2)")


def load_live(campaign: Path) -> dict[str, Any]:
    """The campaign's live document plus ``campaign`` and ``live_age_s`` (None when nothing was written yet)."""
    if not campaign.is_dir():
        raise CampaignError(f"campaign directory {campaign} does not exist",
                            "pass the directory printed by `supervise submit`")
    path = campaign / LIVE_NAME
    base: dict[str, Any] = {"campaign": str(campaign), "live_age_s": None, "job": None, "nodes": [], "ranks": [],
                            "ranks_total": 0, "counters": {}, "events": []}
    try:
        data = path.read_bytes()
        mtime = path.stat().st_mtime
    except FileNotFoundError:
        return base
    except OSError as err:
        raise CampaignError(f"cannot read {path}: {err.strerror}", "check the campaign directory's permissions") from None
    try:
        doc = json.loads(data.decode())  # UnicodeDecodeError is a ValueError
        _check_live(doc)
    except (ValueError, RecursionError) as err:
        raise CampaignError(f"{path} is not a valid live status file ({str(err)[:200]})",
                            "wait a second and retry; the supervisor rewrites it every second") from None
    return {**base, **doc, "live_age_s": round(max(0.0, time.time() - mtime), 3)}


_RANK_FIELDS = {"rank": int, "node": str, "pid": int, "step": int, "phase": str, "state": str}


def _check_live(doc: Any) -> None:
    """The shape ``render_table`` reads (live.json is the supervisor's own file, but a torn or hand-edited one must
    be said in one line, not a traceback)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("ranks"), list) or \
            not isinstance(doc.get("nodes", []), list) or not isinstance(doc.get("counters", {}), dict):  # fmt: skip
        raise ValueError("not a live status document")
    for r in doc["ranks"]:
        if not isinstance(r, dict) or not all(isinstance(r.get(k), t) and not isinstance(r.get(k), bool)
                                              for k, t in _RANK_FIELDS.items()):  # fmt: skip
            raise ValueError("a rank row is not what the supervisor writes")
        for k in ("steps_per_s", "ewma_steps_per_s", "own_s", "beat_age_s"):
            if r.get(k) is not None and not _a_number(r[k]):
                raise ValueError(f"a rank row's {k} is not a number")
    for n in doc.get("nodes", []):
        if not isinstance(n, dict) or not isinstance(n.get("node"), str) or \
                (n.get("staleness_s") is not None and not _a_number(n["staleness_s"])):  # fmt: skip
            raise ValueError("a node row is not what the supervisor writes")


def _a_number(x: Any) -> bool:
    """A figure the table can print (an int of 400 digits overflows the float format)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and abs(x) < 1e300


def _fmt(value: Any, spec: str = "", none: str = "-") -> str:
    if value is None:
        return none
    if isinstance(value, str):
        return value
    return format(value, spec)


def render_table(doc: dict[str, Any]) -> str:
    lines = [f"campaign {doc['campaign']}"]
    age = doc["live_age_s"]
    if age is None:
        lines.append("no live data yet: the supervisor writes live.json once the job's agents report")
        return "\n".join(lines)
    ended = (doc.get("summary") or {}).get("state") in ENDED
    note = (" (the campaign has ended: the ranks as its supervisor last saw them)" if ended
            else " (stale: is the supervisor still running?)" if age > STALE_AFTER_S else "")  # fmt: skip
    lines.append(f"job {doc.get('job')}  updated {age:.1f} s ago{note}  "
                 f"nodes {len(doc['nodes'])}  ranks {doc.get('ranks_total', len(doc['ranks']))}")
    shown = len(doc["ranks"])
    if shown < doc.get("ranks_total", shown):
        lines.append(f"showing the {shown} worst ranks")
    # OWN S: the rank's own time per step (collective waits left out, client.watch_ddp): the straggler's stands out
    header = (f"{'RANK':>6} {'NODE':<12} {'PID':>8} {'STEP':>10} {'PHASE':<10} {'STEPS/S':>8} {'OWN S':>7} "
              f"{'BEAT AGE':>9} STATE")
    lines.append(header)
    for r in doc["ranks"]:
        rate = r.get("steps_per_s")
        if rate is None:
            rate = r.get("ewma_steps_per_s")
        lines.append(f"{r['rank']:>6} {r['node']:<12.12} {r['pid']:>8} {r['step']:>10} {r['phase']:<10.10} "
                     f"{_fmt(rate, '.2f'):>8} {_fmt(r.get('own_s'), '.3f'):>7} {_fmt(r.get('beat_age_s'), '.1f'):>9} "
                     f"{r['state']}")
    stale = [n for n in doc["nodes"] if (n.get("staleness_s") or 0) > 5]
    if stale:
        lines.append("nodes without a recent summary: " + ", ".join(
            f"{n['node']} ({n['staleness_s']:.0f} s)" for n in stale))
    rejected = {k: v for k, v in doc.get("counters", {}).items() if k.startswith("rejected")}
    if rejected:
        lines.append("rejected frames: " + ", ".join(f"{k[9:]}={v}" for k, v in sorted(rejected.items())))
    return "\n".join(lines)


def campaign_summary(campaign: Path) -> dict[str, Any]:
    """The campaign's state and its latest attempt, folded from the journal (the report's first lines)."""
    from supervisor import report_view
    from supervisor.journal import JournalError, read

    path = campaign / paths.JOURNAL_NAME
    try:
        events = read(path) if path.exists() else []
    except JournalError as err:
        return {"state": "unknown", "problem": err.problem}
    doc = report_view.fold(events, now=time.time())
    last = doc["attempts"][-1] if doc["attempts"] else None
    return {"state": doc["state"], "reason": doc["reason"], "attempts": len(doc["attempts"]), "last_attempt": last,
            "excluded_nodes": doc["excluded_nodes"], "latest_checkpoint": doc["checkpoints"]["latest_valid"],
            "checkpoint_interval": doc.get("checkpoint_interval")}


ENDED = {"completed": 0, "failed": 1, "stopped": 1}  # campaign state -> exit code of --watch


def summary_line(summary: dict[str, Any]) -> str:
    from supervisor.report_view import interval_text

    last = summary.get("last_attempt") or {}
    outcome = (last.get("outcome") or {}).get("class", "running") if last else "-"
    if last and last.get("generation"):  # restarted warm: the ranks kept their processes
        outcome += f" (warm restart, generation {last['generation']}, ranks started again: " \
                   f"{', '.join(map(str, last.get('replaced_ranks') or [])) or 'none'})"  # fmt: skip
    ckpt = summary.get("latest_checkpoint") or {}
    return (f"state {summary['state']}" + (f" ({summary['reason']})" if summary.get("reason") else "")
            + f"  attempts {summary.get('attempts', 0)}  last: {outcome}"
            + (f"  latest checkpoint: step {ckpt.get('step')}" if ckpt else "")
            + (f"\ncheckpoint interval: {interval_text(summary['checkpoint_interval'])}"
               if summary.get("checkpoint_interval") else ""))


def current(campaign: Path) -> dict[str, Any]:
    doc = load_live(campaign)
    doc["summary"] = campaign_summary(campaign)
    return doc


def run(args: argparse.Namespace) -> int:
    campaign = Path(args.campaign)
    doc = current(campaign)
    if args.watch:
        from supervisor.errors import UsageError

        if args.json:
            raise UsageError("--watch and --json cannot be combined", "use --json alone in your own loop")
        if not 0.1 <= args.interval <= 3600:
            raise UsageError(f"--interval {args.interval:g} is out of range", "use 0.1 to 3600 seconds")
        from supervisor.commands.status_watch import watch

        return watch(campaign, doc, args.interval)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(summary_line(doc["summary"]))
    print(render_table(doc))
    return 0

"""``supervise status --watch``: the live table redrawn in place until the campaign ends.

rich (the optional ``watch`` extra) draws a coloured table that fits the terminal; without it the plain
table is reprinted after clearing the screen. Reads only live.json and the journal, like ``status``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from supervisor.commands.status import ENDED, STALE_AFTER_S, current, render_table, summary_line

_STATE_STYLE = {"stopped": "bold red", "zombie": "red", "gone": "red", "exited": "yellow", "disk": "yellow"}


def rich_view(doc: dict[str, Any]) -> Any:
    """A rich renderable of one status document (pure: used by tests with a recording console)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    summary = doc["summary"]
    state = summary.get("state", "unknown")
    colour = {"completed": "green", "failed": "red", "stopped": "red", "running": "cyan"}.get(state, "yellow")
    parts: list[Any] = [Text(summary_line(summary), style=f"bold {colour}")]
    age = doc.get("live_age_s")
    if age is None:
        parts.append(Text("no live data yet: the supervisor writes live.json once the job's agents report"))
        return Group(*parts)
    stale = " (stale: is the supervisor still running?)" if age > STALE_AFTER_S and state not in ENDED else ""
    parts.append(Text(f"campaign {doc['campaign']}  job {doc.get('job')}  updated {age:.1f} s ago{stale}  "
                      f"nodes {len(doc['nodes'])}  ranks {doc.get('ranks_total', len(doc['ranks']))}"))  # fmt: skip
    table = Table(expand=False, header_style="bold")
    for name, justify in (("rank", "right"), ("node", "left"), ("pid", "right"), ("step", "right"),
                          ("phase", "left"), ("steps/s", "right"), ("beat age", "right"), ("state", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for r in doc["ranks"]:
        rate = r.get("steps_per_s") if r.get("steps_per_s") is not None else r.get("ewma_steps_per_s")
        beat = r.get("beat_age_s")
        state_text = str(r.get("state"))
        table.add_row(str(r.get("rank")), str(r.get("node")), str(r.get("pid")), str(r.get("step")),
                      str(r.get("phase")), "-" if rate is None else f"{rate:.2f}",
                      Text("-" if beat is None else f"{beat:.1f}", style="red" if beat and beat > 30 else ""),
                      Text(state_text, style=_STATE_STYLE.get(state_text, "")))  # fmt: skip
    parts.append(table)
    return Group(*parts)


def watch(campaign: Path, doc: dict[str, Any], interval_s: float) -> int:
    try:
        from rich.console import Console
        from rich.live import Live
    except ImportError:
        return _plain(campaign, doc, interval_s)
    console = Console()
    with Live(rich_view(doc), console=console, refresh_per_second=4, screen=False) as live:
        while True:
            state = doc["summary"].get("state")
            if state in ENDED:
                live.update(rich_view(doc))
                return ENDED[state]
            time.sleep(interval_s)
            doc = current(campaign)
            live.update(rich_view(doc))


def _plain(campaign: Path, doc: dict[str, Any], interval_s: float) -> int:
    tty = sys.stdout.isatty()
    while True:
        if tty:
            sys.stdout.write("\x1b[H\x1b[2J")
        print(summary_line(doc["summary"]))
        print(render_table(doc), flush=True)
        state = doc["summary"].get("state")
        if state in ENDED:
            return ENDED[state]
        time.sleep(interval_s)
        doc = current(campaign)

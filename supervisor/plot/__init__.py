"""Pictures: ``supervise report --plot`` (a campaign's timeline) and ``supervise simulate --plot`` (the comparison).

``.html`` is built in (self-contained inline SVG); ``.png`` and ``.svg`` use matplotlib, the optional ``plot``
extra. Writers raise :class:`PlotError` with a one-line problem and fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from supervisor.plot import timeline as _timeline


class PlotError(Exception):
    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem, self.fix = problem, fix


_FORMATS = (".html", ".htm", ".png", ".svg")


def check_target(path: str) -> str:
    """'html' or 'mpl' for ``path``; PlotError when the format is unknown or matplotlib is missing."""
    suffix = Path(path).suffix.lower()
    if suffix not in _FORMATS:
        raise PlotError(f"cannot plot to {path}: unknown picture format {suffix or '(none)'}",
                        "name the file .png, .svg or .html")  # fmt: skip
    if suffix in (".png", ".svg"):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise PlotError(f"cannot draw {path}: matplotlib is not installed",
                            "pip install 'slurm-supervisor[plot]', or ask for a .html (built in)") from None  # fmt: skip
    return "html" if suffix in (".html", ".htm") else "mpl"


def _write_text(path: str, text: str) -> None:
    try:
        Path(path).write_text(text)
    except OSError as err:
        raise PlotError(f"cannot write {path}: {err.strerror}", "pick a writable path") from None


def write_timeline(tl: _timeline.Timeline, path: str, campaign: str = "") -> None:
    """A campaign's timeline (``timeline.TimelineView``, fed by the journal's one fold) as a picture at ``path``
    (.png, .svg or .html)."""
    kind = check_target(path)
    tl.campaign = tl.campaign or campaign
    if kind == "html":
        from supervisor.plot import html

        _write_text(path, html.timeline(tl))
    else:
        from supervisor.plot import mpl

        try:
            mpl.timeline(tl, path)
        except OSError as err:
            raise PlotError(f"cannot write {path}: {err.strerror}", "pick a writable path") from None


def write_comparison(doc: Mapping[str, Any], path: str) -> None:
    """``supervise simulate --json``'s document as a picture at ``path``."""
    kind = check_target(path)
    if kind == "html":
        from supervisor.plot import html

        _write_text(path, html.comparison(dict(doc)))
    else:
        from supervisor.plot import mpl

        try:
            mpl.comparison(dict(doc), path)
        except OSError as err:
            raise PlotError(f"cannot write {path}: {err.strerror}", "pick a writable path") from None

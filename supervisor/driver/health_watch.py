"""Node health as the supervisor sees it: the agents' health reports (``wire.EVENT_HEALTH``, kept per node in the
heartbeat table) turned into journal events and into evidence with the node named.

* A report whose problems differ from the node's previous one is journaled (``events.health``): a problem
  appearing, changing severity, or going away. Unchanged reports (one per node every 30 s) are not.
* A fatal finding makes its node **unfit** for the rest of this Slurm run: a hardware Xid is reported once, yet
  the GPU stays suspect after the next clean check. The launch watch ends when a node of the launch is unfit
  (``Watcher``), and the evidence of any ending names the launch's unfit nodes (``Evidence.gpu_faults``): the
  classifier makes that a ``hardware`` interruption blaming the node, which the policy never reuses.
* A filesystem short of space or inodes (``fs_free:``/``fs_inodes:``) never makes a node unfit: the cure is to free
  space, not to exclude a node, and the checkpoint and campaign filesystems are usually shared, while the agents'
  reports arrive one by one (the first to report a shared full disk was blamed for it, seen in the fault
  matrix's full-filesystem row). It is journaled and alerted (L3); a save that then fails is the program's
  ``disk-full`` app error, blaming nobody. An unreadable mount reported by every node that reported (at least
  two) is the shared filesystem's too; on fewer nodes it is theirs (a hung NFS client).
* A shortage of space is alerted once, by the first node to report it, while any node still reports it: a shared
  full disk seen by 64 agents is one alert, not 64 (every node's report is still journaled). It is alerted again
  after every node's report has been clear of it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from supervisor.decisions import events as ev
from supervisor.driver.context import Context
from supervisor.heartbeat.wire import HealthItem, HealthReport

SHARED_CHECK_PREFIXES = ("fs_",)  # checks of a filesystem that may be shared by every node
CAPACITY_CHECK_PREFIXES = ("fs_free:", "fs_inodes:")  # space, not a node's fault: alerted, never unfit


def evidence_line(item: HealthItem) -> str:
    """The classifier's line for one finding (``Evidence.gpu_faults[node]``)."""
    return f"{item.what} ({item.check} {item.value}, threshold {item.threshold})"


def as_detection(node: str, item: HealthItem) -> dict[str, Any]:
    """Detection-shaped dict for the alert of the interruption: it carries this check's metric, value, threshold."""
    return {"kind": ev.HARDWARE, "metric": item.check, "value": item.value, "threshold": item.threshold,
            "duration_s": None, "nodes": [node], "evidence": [item.what]}  # fmt: skip


def _finding(item: HealthItem) -> dict[str, str]:
    return item._asdict()


class HealthWatch:
    """Reads the table's health reports (``update``), journals changes, answers which nodes are unfit."""

    def __init__(self, ctx: Context, allocation: Iterable[str] = (),
                 on_news: Callable[[str, tuple[HealthItem, ...]], None] | None = None) -> None:  # fmt: skip
        """``on_news(node, items)``: problems a node did not have in its previous report (the alerts)."""
        self.record, self.clock, self.on_news = ctx.record, ctx.clock, on_news
        self.allocation = tuple(allocation)  # the job's nodes: whose reports tell a shared filesystem apart
        self.received: dict[str, float] = {}  # node -> receipt time of the report last looked at
        self.reports: dict[str, HealthReport] = {}  # node -> its newest report
        self.shown: dict[str, tuple[tuple[str, str], ...]] = {}  # node -> problems last journaled
        self.unfit: dict[str, dict[str, HealthItem]] = {}  # node -> check -> fatal finding (this Slurm run)
        self.capacity_alerted: set[str] = set()  # fs_free:/fs_inodes: checks alerted while some node reports them

    def update(self, table: Any) -> None:
        """Take the reports that arrived since the last call (``table.health``: node -> (time, report))."""
        health: Mapping[str, tuple[float, HealthReport]] = getattr(table, "health", {})
        for node, (at, report) in list(health.items()):
            if self.received.get(node) == at:
                continue
            self.received[node], self.reports[node] = at, report
            for item in report.fatal:
                if not item.check.startswith(CAPACITY_CHECK_PREFIXES):
                    self.unfit.setdefault(node, {})[item.check] = item
            problems = tuple(sorted((f.severity, f.check) for f in report.findings))
            before = self.shown.get(node, ())
            if problems != before:
                self.shown[node] = problems
                self.record(ev.health(self.clock(), node, report.nvml, [_finding(f) for f in report.findings],
                                      bool(report.fatal)))  # fmt: skip
                news = self._not_yet_alerted(tuple(f for f in report.findings if (f.severity, f.check) not in before))
                if news and self.on_news is not None:
                    self.on_news(node, news)
        self._forget_cleared_capacity()

    def _not_yet_alerted(self, news: tuple[HealthItem, ...]) -> tuple[HealthItem, ...]:
        """Drop the capacity findings another node already alerted (see the module docstring)."""
        kept = []
        for item in news:
            if item.check.startswith(CAPACITY_CHECK_PREFIXES):
                if item.check in self.capacity_alerted:
                    continue
                self.capacity_alerted.add(item.check)
            kept.append(item)
        return tuple(kept)

    def _forget_cleared_capacity(self) -> None:
        reported = {f.check for r in self.reports.values() for f in r.findings}
        self.capacity_alerted &= reported

    def _shared(self, check: str, reporting: Iterable[str]) -> bool:
        nodes = [n for n in reporting if n in self.reports]
        return check.startswith(SHARED_CHECK_PREFIXES) and len(nodes) >= 2 and all(
            check in self.unfit.get(n, {}) for n in nodes)  # fmt: skip

    def faults(self, nodes: Iterable[str]) -> dict[str, tuple[HealthItem, ...]]:
        """The fatal findings of ``nodes`` that are theirs (shared-filesystem ones left out)."""
        wanted = list(nodes)
        peers = list(self.allocation) or wanted
        out = {}
        for node in wanted:
            items = tuple(i for c, i in sorted(self.unfit.get(node, {}).items()) if not self._shared(c, peers))
            if items:
                out[node] = items
        return out



def gpu_faults(faults: Mapping[str, tuple[HealthItem, ...]]) -> dict[str, tuple[str, ...]]:
    """``Evidence.gpu_faults``: node -> the classifier's lines."""
    return {node: tuple(evidence_line(i) for i in items) for node, items in faults.items()}


def detections(faults: Mapping[str, tuple[HealthItem, ...]]) -> tuple[dict[str, Any], ...]:
    """``Evidence.health_findings``: the alert's metric/value/threshold come from these."""
    return tuple(as_detection(node, i) for node, items in sorted(faults.items()) for i in items)

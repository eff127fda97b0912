"""Xid events as a node sees them: the kernel log's ``NVRM: Xid`` records and NVML's events, each an
:class:`XidEvent`. Which codes mean the hardware is ``decisions/xid.py``'s table (one table for the agents'
checks and the classifier's log lines): hardware codes make the node unfit (drained in operator mode),
application codes are reported as a crash's explanation, unknown codes warn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class XidEvent:
    code: int
    gpu: str  # GPU index, UUID or PCI address, as the source names it
    age_s: float | None = None  # how long ago (kernel log), None: just now (NVML event)
    text: str = ""


# The kernel driver's line: "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
_KMSG_XID = re.compile(r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<code>\d+)")


def parse_kmsg(records: Iterable[str], uptime_s: float) -> list[XidEvent]:
    """Xid events from /dev/kmsg records (``prio,seq,usec_since_boot,flags;message``); pure."""
    out: list[XidEvent] = []
    for record in records:
        head, _, message = record.partition(";")
        m = _KMSG_XID.search(message)
        if not m:
            continue
        try:
            usec = int(head.split(",")[2])
            age: float | None = max(0.0, uptime_s - usec / 1e6)
        except (IndexError, ValueError):
            age = None
        out.append(XidEvent(int(m.group("code")), m.group("pci"), age, message.strip()[:200]))
    return out

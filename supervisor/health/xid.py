"""NVIDIA Xid codes: which mean the hardware (drain the node) and which usually mean the application.

Source for every code: NVIDIA, "Xid Errors" (https://docs.nvidia.com/deploy/xid-errors/), the table of causes
(HW error, driver error, user application error, system memory corruption, bus error, thermal, FB corruption)
and its per-code notes; and NVIDIA, "GPU Memory Error Management" (https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/)
for the ECC/row-remapping codes 63, 64, 94, 95. Application-level codes are reported (they explain a crash, and
feed the classifier as the application's fault) but never drain a node; hardware codes do; unknown codes warn.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

HARDWARE = "hardware"
APPLICATION = "application"
UNKNOWN = "unknown"

# code -> (kind, meaning). Kept short; the NVIDIA table has the full cause lists.
XID_TABLE: dict[int, tuple[str, str]] = {
    13: (APPLICATION, "graphics engine exception (usually an out-of-bounds access in a kernel)"),
    31: (APPLICATION, "GPU memory page fault (usually an illegal address in the application)"),
    43: (APPLICATION, "GPU stopped processing (the application's channel was reset)"),
    45: (APPLICATION, "preemptive cleanup after earlier errors or a killed application"),
    68: (APPLICATION, "video processor (NVDEC) exception, usually the decoding application"),
    48: (HARDWARE, "double-bit ECC error (uncorrectable)"),
    63: (HARDWARE, "ECC page retirement or row remapping recorded: reset the GPU to apply it"),
    64: (HARDWARE, "ECC page retirement or row remapping failed: replace the GPU"),
    74: (HARDWARE, "NVLink error"),
    79: (HARDWARE, "GPU has fallen off the bus"),
    92: (HARDWARE, "high single-bit ECC error rate"),
    94: (HARDWARE, "contained ECC error: reset the GPU"),
    95: (HARDWARE, "uncontained ECC error: reset the GPU, the node's other work may be affected"),
    119: (HARDWARE, "GSP RPC timeout (GPU firmware not answering)"),
    120: (HARDWARE, "GSP error (GPU firmware)"),
}


def kind_of(code: int) -> str:
    return XID_TABLE.get(code, (UNKNOWN, ""))[0]


def meaning_of(code: int) -> str:
    return XID_TABLE.get(code, (UNKNOWN, "not in the project's table: see NVIDIA's Xid documentation"))[1]


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

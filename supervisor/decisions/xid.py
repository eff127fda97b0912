"""NVIDIA Xid codes: which mean the hardware and which usually mean the application. The one table: the node
agents' health checks (``health/checks.py``) and the classifier's log lines (``decisions/log_signatures.py``) both
read it, so an Xid printed in a rank's log and the same Xid read from the kernel log get the same verdict.

Source for every code: NVIDIA, "Xid Errors" (https://docs.nvidia.com/deploy/xid-errors/): the cause table
(HW error, driver error, user application error, ...) and the Xid catalogue for Ampere and newer GPUs, whose
"immediate action" is ``RESTART_APP`` for the application codes and a GPU reset, a node reboot or a support
case for the hardware ones; and NVIDIA, "GPU Memory Error Management"
(https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/) for the ECC and row-remapping codes 63, 64, 94, 95.

An application code explains a crash as the program's (an out-of-bounds access faults the GPU's MMU: Xid 31),
never drains a node; a hardware code does; a code not in the table is neither: a weak ``unknown`` that blames
nobody. Pure."""

from __future__ import annotations

HARDWARE = "hardware"
APPLICATION = "application"
UNKNOWN = "unknown"

# code -> (kind, meaning). Kept short; NVIDIA's catalogue has the full cause lists and trigger conditions.
XID_TABLE: dict[int, tuple[str, str]] = {
    8: (APPLICATION, "GPU stopped processing (a channel idle timeout: restart the application)"),
    13: (APPLICATION, "graphics engine exception (usually an out-of-bounds access in a kernel)"),
    31: (APPLICATION, "GPU memory page fault (usually an illegal address in the application)"),
    43: (APPLICATION, "GPU stopped processing (the application's channel was reset)"),
    45: (APPLICATION, "preemptive cleanup after earlier errors or a killed application"),
    68: (APPLICATION, "video processor (NVDEC) exception, usually the decoding application"),
    48: (HARDWARE, "double-bit ECC error (uncorrectable)"),
    61: (HARDWARE, "internal micro-controller breakpoint/warning (GPU firmware)"),
    62: (HARDWARE, "internal micro-controller halt (GPU firmware)"),
    63: (HARDWARE, "ECC page retirement or row remapping recorded: reset the GPU to apply it"),
    64: (HARDWARE, "ECC page retirement or row remapping failed: replace the GPU"),
    74: (HARDWARE, "NVLink error"),
    79: (HARDWARE, "GPU has fallen off the bus"),
    92: (HARDWARE, "high single-bit ECC error rate"),
    94: (HARDWARE, "contained ECC error: reset the GPU"),
    95: (HARDWARE, "uncontained ECC error: reset the GPU, the node's other work may be affected"),
    119: (HARDWARE, "GSP RPC timeout (GPU firmware not answering)"),
    120: (HARDWARE, "GSP error (GPU firmware)"),
    140: (HARDWARE, "unrecovered ECC error"),
    143: (HARDWARE, "GPU initialization failure"),
    154: (HARDWARE, "GPU recovery action changed: the driver asks for a GPU reset or a node reboot"),
}


def kind_of(code: int) -> str:
    """``hardware``, ``application`` or ``unknown`` (not in the table)."""
    return XID_TABLE.get(code, (UNKNOWN, ""))[0]


def meaning_of(code: int) -> str:
    return XID_TABLE.get(code, (UNKNOWN, "not in the project's table: see NVIDIA's Xid catalogue"))[1]


def codes(kind: str) -> tuple[int, ...]:
    """The table's codes of one kind, in order (docs/health.md lists them; a test checks)."""
    return tuple(sorted(code for code, (k, _) in XID_TABLE.items() if k == kind))

"""Log signatures: a log-line pattern and the interruption class it indicates, the built-in table and the user's
``[log_signatures]`` additions. ``classify`` matches them against the launch's attributed log lines; first match
wins, so specific patterns come before general ones, and the user's come before the built-in ones.

The program's printed text is untrusted (docs/security.md): a data sample, a log message or a hostile rank may
print anything. So a signature that speaks for Slurm (``slurm=True``: a node failure, a cancel, a preemption) is
matched only on lines Slurm wrote itself, the ones srun did not label with a task id; the program's own lines are
evidence about the program. And only the first ``MATCH_CHARS`` characters of a line are matched: a real error
line is far shorter, and a pattern like ``gloo.*timeout`` on a 64 KiB line of ``gloo`` repeated takes seconds.

A ``hardware`` class is given only to what names the hardware: an Xid code the table calls hardware, a GPU off
the bus, an uncorrectable ECC or NVLink error. A CUDA error the program usually causes (a device-side assert, an
illegal address, a failed launch) is the program's; the ambiguous ones are ``suspect``, made ``hardware`` by
``classify`` only on corroboration (docs/decisions.md, "Hardware needs hardware evidence")."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from supervisor.decisions import events as ev
from supervisor.decisions import xid

MATCH_CHARS = 2048  # the part of a line the signatures look at


@dataclass(frozen=True)
class LogSignature:
    """A log-line pattern and the class it indicates. A named group ``node`` names that node (blamed only when it is
    one of the job's); a group ``xid`` names an NVIDIA Xid code, whose class is the Xid table's (``verdict``).
    ``slurm``: Slurm's own message, matched only on lines srun did not label. ``suspect``: an error the GPU *can*
    cause but the program (or the network) usually does: it keeps its own class unless hardware evidence on the
    same node corroborates it (``classify``)."""

    name: str
    pattern: re.Pattern[str]
    cls: str
    confidence: float = 0.8
    slurm: bool = False
    suspect: bool = False


def _sig(name: str, regex: str, cls: str, confidence: float = 0.8, *, slurm: bool = False,
         suspect: bool = False) -> LogSignature:  # fmt: skip
    return LogSignature(name, re.compile(regex), cls, confidence, slurm, suspect)


# The wording is torch's, CUDA's, NCCL's and the NVIDIA kernel driver's (tests/unit/test_root_cause.py quotes
# each). First match wins, so specific patterns come before general ones.
DEFAULT_LOG_SIGNATURES: tuple[LogSignature, ...] = (
    _sig("slurm-preempted", r"CANCELLED AT \S+ DUE TO PREEMPTION", ev.PREEMPTION, 0.95, slurm=True),
    _sig("slurm-time-limit", r"CANCELLED AT \S+ DUE TO TIME LIMIT", ev.TIMEOUT, 0.95, slurm=True),
    _sig("slurm-node-fail", r"CANCELLED AT \S+ DUE TO NODE FAILURE", ev.NODE_FAILURE, 0.9, slurm=True),
    _sig("slurm-launch-failed", r"failed on node (?P<node>[\w.\-]+): Communication connection failure",
         ev.NODE_FAILURE, 0.9, slurm=True),  # fmt: skip
    _sig("slurm-node-failure", r"due to failure of node (?P<node>[\w.\-\[\],]+)", ev.NODE_FAILURE, 0.9, slurm=True),
    _sig("slurm-comm-failure", r"Communication connection failure", ev.NODE_FAILURE, 0.6, slurm=True),
    _sig("cuda-oom", r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError", ev.APP_ERROR, 0.9),
    # A kernel's assert (an index out of range): the program's, wherever it runs.
    _sig("cuda-device-assert", r"device-side assert triggered|cudaErrorAssert|CUDA_ERROR_ASSERT|"
         r"\.cu:\d+: .{0,200}Assertion .{0,600} failed", ev.APP_ERROR, 0.9),  # fmt: skip
    # The NVIDIA driver's Xid line (``NVRM: Xid (PCI:0000:3b:00): 79, ...``), DCGM's ``Xid error 79``, ``XID 79``:
    # the class is the Xid table's (decisions/xid.py).
    _sig("xid", r"(?ai:\bxid\b)(?: ?\([^)]{0,80}\))?[:,]? ?(?ai:error:? ?)?(?P<xid>[0-9]{1,4})\b", ev.HARDWARE, 0.9),
    _sig("gpu-lost", r"fallen off the bus|GPU is lost|GPU lost", ev.HARDWARE, 0.9),
    _sig("ecc", r"uncorrectable ECC error|ECC error|DBE \(double bit error\)|uncorrectable NVLink error",
         ev.HARDWARE, 0.9),  # fmt: skip
    # Ambiguous: an illegal address or a failed launch is almost always the program's (or a library's) bug, and
    # only sometimes a failing GPU; NCCL's "unhandled system error" is a socket, an IB link or shared memory.
    _sig("cuda-illegal-access", r"an illegal memory access was encountered|CUDA_ERROR_ILLEGAL_ADDRESS|"
         r"cudaErrorIllegalAddress|unspecified launch failure|CUDA_ERROR_LAUNCH_FAILED|cudaErrorLaunchFailure|"
         r"an illegal instruction was encountered|misaligned address", ev.APP_ERROR, 0.7, suspect=True),  # fmt: skip
    _sig("nccl-cuda-error", r"unhandled cuda error|ncclUnhandledCudaError", ev.APP_ERROR, 0.7, suspect=True),
    _sig("nccl-system-error", r"unhandled system error|ncclSystemError", ev.COMM_ERROR, 0.7, suspect=True),
    _sig("cuda-error", r"CUDA error|CUDA_ERROR_|cudaError", ev.APP_ERROR, 0.6, suspect=True),
    # NCCL refusing its use ("Duplicate GPU detected", "no socket interface found"): the job's configuration.
    _sig("nccl-invalid-usage", r"ncclInvalidUsage|NCCL error in: .{0,300}invalid usage", ev.APP_ERROR, 0.85),
    _sig("nccl-watchdog", r"Watchdog caught collective operation timeout", ev.COMM_ERROR, 0.8),
    _sig("nccl-remote", r"remote process exit|ncclRemoteError", ev.COMM_ERROR, 0.8),
    _sig("nccl", r"NCCL WARN|NCCL error|ncclInternalError", ev.COMM_ERROR, 0.8),
    _sig("peer-closed", r"Connection closed by (?:remote )?peer|Connection reset by peer|Connection refused|Broken pipe",
         ev.COMM_ERROR, 0.7),  # fmt: skip
    _sig("gloo", r"[Gg]loo.*(Connection|Timed out|timeout|Socket)", ev.COMM_ERROR, 0.8),
    _sig("dist-network", r"DistNetworkError|DistBackendError|c10d.*(timed out|Socket Timeout)", ev.COMM_ERROR, 0.7),
    # A full (or over-quota) filesystem under a save: torch.save says only "unexpected pos N vs M".
    _sig("disk-full", r"No space left on device|Disk quota exceeded|unexpected pos \d+ vs \d+|"
         r"PytorchStreamWriter failed writing", ev.APP_ERROR, 0.9),  # fmt: skip
    _sig("segfault", r"Segmentation fault|Fatal Python error", ev.APP_ERROR, 0.8),
    _sig("traceback", r"Traceback \(most recent call last\)", ev.APP_ERROR, 0.7),
    _sig("python-exception", r"^(?:\[rank\d+\]:\s*|\d+:\s*)?(\w+\.)*\w*(Error|Exception)(: |$)", ev.APP_ERROR, 0.6),
)

XID_CLASSES = {xid.HARDWARE: (ev.HARDWARE, 0.9), xid.APPLICATION: (ev.APP_ERROR, 0.8), xid.UNKNOWN: (ev.UNKNOWN, 0.4)}


def verdict(sig: LogSignature, match: re.Match[str]) -> tuple[str, float, str]:
    """(class, confidence, what the line means) for a matched line: the signature's own, except for an Xid line,
    whose code the Xid table judges: a hardware code is ``hardware``, an application code (13, 31, 43, ...) the
    program's ``app_error``, a code not in the table a weak ``unknown`` that blames nobody."""
    code = match.groupdict().get("xid")
    if code is None:
        return sig.cls, sig.confidence, sig.name
    kind = xid.kind_of(int(code))
    cls, confidence = XID_CLASSES[kind]
    return cls, confidence, f"{sig.name} {int(code)}, {kind}: {xid.meaning_of(int(code))}"


def signatures_from_table(table: Mapping[str, str], base: Sequence[LogSignature] = DEFAULT_LOG_SIGNATURES
                          ) -> tuple[LogSignature, ...]:  # fmt: skip
    """User signatures ``{regex: class}`` placed before ``base`` (so users can override). Bad entries raise
    ValueError naming the entry and the fix."""
    extra = []
    for i, (regex, cls) in enumerate(table.items()):
        if cls not in ev.INTERRUPTION_CLASSES:
            raise ValueError(
                f"log_signatures[{regex!r}]: unknown class {cls!r}; use one of {', '.join(ev.INTERRUPTION_CLASSES)}"
            )
        try:
            pattern = re.compile(regex)
        except re.error as e:
            raise ValueError(f"log_signatures[{regex!r}]: invalid regular expression ({e}); fix the pattern") from e
        extra.append(LogSignature(f"user-{i}", pattern, cls, 0.85))
    return (*extra, *base)

"""Failure traces: the Llama 3 mix (Meta, 2024) at any scale, seeded, or a CSV file (time, class, node). Pure.

The Llama 3 report lists 419 unexpected interruptions in 54 days of pre-training on 16,384 H100 GPUs; the mix
below is theirs, the 16 unattributed ones are "unknown". The rate scales with the number of GPUs (failures are
per component), so 131,072 GPUs see about eight times as many.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

LLAMA3_GPUS = 16_384
LLAMA3_DAYS = 54.0
LLAMA3_MIX: Mapping[str, int] = MappingProxyType({
    "gpu": 148, "hbm3": 72, "software": 54, "network": 35, "host_maintenance": 32, "sram": 19, "gsp": 17,
    "nic": 7, "nccl_watchdog": 7, "sdc": 6, "thermal": 6, "unknown": 16,
})  # fmt: skip
LLAMA3_TOTAL = sum(LLAMA3_MIX.values())  # 419


class TraceError(ValueError):
    """A trace file cannot be read: the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Fault:
    t: float  # seconds from the campaign start
    kind: str  # one of LLAMA3_MIX's keys (the symptom family), see evidence.py
    node: str  # the node it happened on (mapped onto a running node if the job is elsewhere)


def node_name(index: int) -> str:
    return f"n{index:05d}"


def llama3(seed: int, gpus: int = LLAMA3_GPUS, days: float = LLAMA3_DAYS, gpus_per_node: int = 8,
           rate_scale: float = 1.0) -> list[Fault]:  # fmt: skip
    """A Poisson trace with Llama 3's rate per GPU-day and mix, faults spread evenly over the job's nodes."""
    if gpus < 1 or days <= 0 or gpus_per_node < 1 or rate_scale < 0:
        raise ValueError("gpus, days and gpus_per_node must be positive, rate_scale >= 0")
    rng = random.Random(seed)
    horizon = days * 86400.0
    rate = rate_scale * LLAMA3_TOTAL / (LLAMA3_GPUS * LLAMA3_DAYS * 86400.0) * gpus  # faults per second
    nodes = max(1, math.ceil(gpus / gpus_per_node))
    kinds, weights = list(LLAMA3_MIX), list(LLAMA3_MIX.values())
    faults: list[Fault] = []
    t = 0.0
    if rate == 0:
        return []
    while True:
        t += rng.expovariate(rate)
        if t >= horizon:
            return faults
        faults.append(Fault(t, rng.choices(kinds, weights)[0], node_name(rng.randrange(nodes))))


def read_csv(path: str | Path) -> list[Fault]:
    """``time,class,node`` lines (a header line is allowed; time in seconds from the start; class one of the
    Llama 3 kinds), sorted by time. Raises :class:`TraceError` on anything else."""
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise TraceError(f"cannot read trace {path}: {err.strerror}; give an existing CSV file") from None
    return parse_csv(text.splitlines(), str(path))


def parse_csv(lines: Iterable[str], where: str = "trace") -> list[Fault]:
    faults = []
    for n, row in enumerate(csv.reader(lines), 1):
        if not row or row[0].strip().startswith("#") or (n == 1 and row[0].strip().lower() == "time"):
            continue
        if len(row) != 3:
            raise TraceError(f"{where}:{n}: expected 3 fields time,class,node, got {len(row)}")
        t_text, kind, node = (x.strip() for x in row)
        try:
            t = float(t_text)
        except ValueError:
            raise TraceError(f"{where}:{n}: time {t_text!r} is not a number of seconds") from None
        if not math.isfinite(t) or t < 0:
            raise TraceError(f"{where}:{n}: time {t_text!r} must be >= 0 seconds from the start")
        if kind not in LLAMA3_MIX:
            raise TraceError(f"{where}:{n}: unknown class {kind!r}; use one of {', '.join(LLAMA3_MIX)}")
        if not node:
            raise TraceError(f"{where}:{n}: empty node name")
        faults.append(Fault(t, kind, node))
    return sorted(faults, key=lambda f: f.t)

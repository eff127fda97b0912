"""Parsing ``scontrol show config`` and ``scontrol show partition -o``: what ``supervise doctor`` judges.

``show config`` prints ``Key = Value`` lines (units appended: ``5 sec``, ``0 min``), then sections for plugins
(cgroup, MPI...) whose keys may repeat; the first occurrence is slurmctld's own setting and wins. Raises only
:class:`slurm.parse.ParseError`.
"""

from __future__ import annotations

import re

from slurm.parse import ParseError
from slurm.parse_scontrol import parse_key_values

_LINE = re.compile(r"^([A-Za-z][A-Za-z0-9_]*)\s*=\s?(.*)$")


def parse_scontrol_config(output: str) -> dict[str, str]:
    """{Key: Value} of ``scontrol show config``; raises ParseError when no setting is found."""
    if not isinstance(output, str):
        raise ParseError("scontrol show config output is not text")
    out: dict[str, str] = {}
    for line in output.splitlines():
        m = _LINE.match(line.strip())
        if m and m.group(1) not in out:
            out[m.group(1)] = m.group(2).strip()
    if "SLURM_VERSION" not in out and "ClusterName" not in out:
        raise ParseError("no Slurm settings in `scontrol show config` output")
    return out


def parse_scontrol_partitions(output: str) -> list[dict[str, str]]:
    """One {Key: Value} per line of ``scontrol show partition -o``."""
    if not isinstance(output, str):
        raise ParseError("scontrol show partition output is not text")
    parts = [parse_key_values(line) for line in output.splitlines() if line.strip()]
    for p in parts:
        if "PartitionName" not in p:
            raise ParseError("a line of `scontrol show partition -o` has no PartitionName")
    return parts


def seconds(value: str | None) -> float | None:
    """``"5 sec"`` -> 5, ``"2 min"`` -> 120, ``"00:01:30"`` -> 90; ``UNLIMITED``/``INFINITE`` -> inf; None when
    absent or not a duration (``(null)``, ``NONE``)."""
    if value is None:
        return None
    text = value.strip().upper()
    if text in ("UNLIMITED", "INFINITE"):
        return float("inf")
    m = re.fullmatch(r"(\d{1,12})\s*(SEC|MIN|HOUR|HOURS|DAYS?)?", text)  # (a 5,000-digit number: not Slurm's)
    if m:
        scale = {"SEC": 1, "MIN": 60, "HOUR": 3600, "HOURS": 3600, "DAY": 86400, "DAYS": 86400}.get(m.group(2) or "SEC", 1)
        return float(int(m.group(1)) * scale)
    m = re.fullmatch(r"(?:(\d{1,9})-)?(\d{1,9}):(\d\d):(\d\d)", text)
    if m:
        days, h, mi, s = (int(g or 0) for g in m.groups())
        return float(((days * 24 + h) * 60 + mi) * 60 + s)
    return None

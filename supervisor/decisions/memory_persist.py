"""When the node agents persist the newest memory snapshot to the filesystem while the training runs. Pure.

The memory tier answers the faults that leave the allocation's memory (a rank, a node with its buddy alive); the
copy flushed before a requeue or a stop answers most of the rest. What neither answers (the flush failed: a
switch took a node and its buddy, slurmctld killed the job before the copy was done) falls back to the
program's own filesystem checkpoint, whose saves stall the training every time. Copying the newest complete
snapshot from node memory to the campaign directory now and then (``driver.memory_persist``) costs the training
nothing (the agents copy on a thread of their own, from memory the ranks no longer touch) and bounds that loss
by the persist interval, like an asynchronous checkpoint whose staging copy the snapshot already paid.

"auto" persists every ``AUTO_MIN_S`` seconds, or less often when a copy took long: the copies occupy at most
``AUTO_DUTY`` of the time (the filesystem is shared with every other job on the site). A number fixes the
interval; "off" disables it (the stop's flush stays).
"""

from __future__ import annotations

AUTO_MIN_S = 60.0
AUTO_DUTY = 0.1  # the share of the time the copies may take
MIN_S, MAX_S = 1.0, 86_400.0  # a fixed interval's bounds
OFF = "off"
AUTO = "auto"


class PersistSettingError(ValueError):
    """``[run] memory_persist`` is neither "auto", "off" nor a number of seconds in bounds."""


def parse_setting(value: object) -> str | float:
    if value in (AUTO, OFF):
        return str(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and MIN_S <= value <= MAX_S:
        return float(value)
    raise PersistSettingError(f"run.memory_persist = {value!r} is not allowed (allowed: \"auto\", \"off\" or seconds "
                              f"from {MIN_S:g} to {MAX_S:g})")


def every_s(setting: str | float, last_copy_s: float | None) -> float | None:
    """Seconds between persists for ``setting`` given the last copy's duration (None: none measured yet)."""
    if setting == OFF:
        return None
    if isinstance(setting, float):
        return setting
    return max(AUTO_MIN_S, (last_copy_s or 0.0) / AUTO_DUTY)


def due(every: float | None, since_last_s: float | None, newest_step: int | None, persisted_step: int | None) -> bool:
    """Start a persist now? ``since_last_s``: since the last one was started (None: never in this run);
    ``newest_step``: the newest snapshot complete in memory; ``persisted_step``: the newest on the filesystem
    (the flushed copy, or the program's own checkpoint: nothing older is worth a copy)."""
    if every is None or newest_step is None:
        return False
    if persisted_step is not None and newest_step <= persisted_step:
        return False
    return since_last_s is None or since_last_s >= every

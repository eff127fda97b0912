"""What every part of the driver needs of the attempt, in one small value: journal an event (``record``: journal
first, then act), tell the time (``clock``, wall seconds: the journal's time), and survive its own failures
(``guard``: a stage's exception is journaled as ``supervisor_error`` and supervision goes on)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from supervisor.driver.guard import Guard


@dataclass(frozen=True)
class Context:
    record: Callable[[dict[str, Any]], None]
    clock: Callable[[], float]
    guard: Guard

    @classmethod
    def of(cls, record: Callable[[dict[str, Any]], None], clock: Callable[[], float] = time.time) -> Context:
        return cls(record, clock, Guard(record, clock))

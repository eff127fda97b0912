"""structlog set-up for the supervisor process: JSON lines, one per decision, to a file and to stderr."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import structlog


def configure(path: Path | None = None) -> None:
    """JSON lines with an ISO timestamp; ``path`` (0600) also gets them, so the campaign keeps its own log."""
    streams = [sys.stderr]
    if path is not None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        streams.append(os.fdopen(fd, "a", buffering=1))

    class _Tee:
        def write(self, text: str) -> None:
            for s in streams:
                s.write(text)

        def flush(self) -> None:
            for s in streams:
                s.flush()

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.JSONRenderer(sort_keys=True, default=str),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=_Tee()),  # type: ignore[arg-type]
        cache_logger_on_first_use=False,
    )

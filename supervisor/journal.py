"""The campaign journal: append-only JSON lines, fsynced, the single source of truth of a campaign.

Format (contract): one JSON object per line, ``{"v": SCHEMA_VERSION, "t": <unix time>, "type": ..., ...}``.

Crash safety without ever rewriting the file:
- the writer appends each event with one ``write`` to a file opened with ``O_APPEND`` and fsyncs it, so a crash
  can leave at most one torn line, at the end;
- a reader ignores (and reports) an unparsable *last* line;
- when a writer reopens a journal whose last line is torn, it first appends a newline (sealing the fragment on
  its own line) and then a ``journal_resumed`` event naming the fragment's byte offset; readers skip a torn line
  that is vouched for this way. Any other unparsable line is corruption and raises :class:`JournalCorrupt`:
  silently dropping events from the middle would make reports lie.

One writer (the supervisor, enforced with an exclusive ``flock``), any number of readers (``status``, ``report``).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from supervisor import paths
from supervisor.errors import CampaignError

SCHEMA_VERSION = 1
JOURNAL_NAME = paths.JOURNAL_NAME
RESUMED = "journal_resumed"

Event = dict[str, Any]
T = TypeVar("T")


class JournalError(CampaignError):
    """The journal cannot be read or written."""


class JournalCorrupt(JournalError):
    """A line other than a torn tail is not a valid event."""


class JournalTooNew(JournalError):
    """The journal was written by a newer schema than this program understands."""


class JournalLocked(JournalError):
    """Another process already writes this journal."""


@dataclass(frozen=True)
class JournalContents:
    """What a read found: the events, and whether torn lines were skipped (and where)."""

    events: list[Event]
    torn_tail: bool = False
    sealed_fragments: tuple[int, ...] = field(default=())  # byte offsets of earlier torn lines a writer sealed


def _decode(line: bytes) -> Event | None:
    """Parse one line; None when it is not a JSON object with a version and a type."""
    try:
        obj = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: hostile deep nesting
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("type"), str) or not isinstance(obj.get("v"), int):
        return None
    return obj


def parse(data: bytes, where: str = "journal") -> JournalContents:
    """Pure: decode a journal's bytes (see the module docstring for the torn-line rules)."""
    # Lines end with b"\n" only, as the writer writes them and as the torn-tail seal finds them (a raw b"\r"
    # is never written: JSON escapes it), so reader and re-seal agree on every line's byte offset.
    lines: list[tuple[int, bytes]] = []
    offset = 0
    for raw in data.split(b"\n"):
        lines.append((offset, raw))
        offset += len(raw) + 1
    events: list[Event] = []
    sealed: list[int] = []
    torn_tail = False
    pending_bad: tuple[int, int] | None = None  # (line number, byte offset) of an unparsable line awaiting a voucher
    for index, (start, raw) in enumerate(lines):
        text = raw.strip()
        if not text:
            continue
        event = _decode(text)
        if pending_bad is not None:
            bad_line, bad_offset = pending_bad
            if event is not None and event["type"] == RESUMED and event.get("torn_offset") == bad_offset:
                sealed.append(bad_offset)
                pending_bad = None
            else:
                raise JournalCorrupt(
                    f"{where}: line {bad_line} (byte {bad_offset}) is not a valid event and is not the last line",
                    "the journal was edited or damaged; restore it from a backup, or move the damaged line "
                    "into a separate file by hand (the supervisor never rewrites journals)",
                )
        if event is None:
            pending_bad = (index + 1, start)
            continue
        version = event["v"]
        if version > SCHEMA_VERSION:
            raise JournalTooNew(
                f"{where}: line {index + 1} has schema version {version}, this supervisor reads up to {SCHEMA_VERSION}",
                "upgrade slurm-supervisor to read this campaign",
            )
        if event["type"] != RESUMED:
            events.append(event)
    if pending_bad is not None:  # the last non-blank line is torn: a crash mid-append, tolerated
        torn_tail = True
    return JournalContents(events=events, torn_tail=torn_tail, sealed_fragments=tuple(sealed))


def load(path: str | os.PathLike[str]) -> JournalContents:
    """Read a journal (a reader never blocks or disturbs the writer)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise JournalError(f"no journal at {os.fspath(path)}", "pass a campaign directory made by `supervise submit`") from None
    except OSError as e:
        raise JournalError(f"cannot read journal {os.fspath(path)}: {e.strerror}", "check the path and permissions") from e
    return parse(data, where=os.fspath(path))


def read(path: str | os.PathLike[str]) -> list[Event]:
    """The events of a journal, a torn last line ignored (use :func:`load` to learn whether there was one)."""
    return load(path).events


def _default(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value) if isinstance(value, (set, frozenset)) else list(value)
    raise TypeError(f"journal events must be JSON data, got {type(value).__name__}")


def encode(event: Mapping[str, Any], t: float) -> bytes:
    """Pure: one journal line for ``event``. Non-finite floats become strings: JSON has no NaN."""
    if not isinstance(event.get("type"), str):
        raise ValueError("a journal event needs a string 'type' field")
    record: Event = {"v": SCHEMA_VERSION, "t": t}
    record.update({k: v for k, v in event.items() if k not in ("v", "t")})
    record["t"] = float(event.get("t", t))
    text = json.dumps(_finite(record), default=_default, separators=(",", ":"), allow_nan=False)
    return text.encode() + b"\n"


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # 'nan', 'inf', '-inf': keeps the evidence visible
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Journal:
    """The single writer of a campaign journal. Use as a context manager or call :meth:`close`."""

    def __init__(self, path: str | os.PathLike[str], clock: Callable[[], float] = time.time) -> None:
        self.path = os.fspath(path)
        self._clock = clock
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
        created = not os.path.exists(self.path)
        try:
            self._fd = os.open(self.path, flags, 0o600)
        except OSError as e:
            raise JournalError(f"cannot open journal {self.path}: {e.strerror}", "check the campaign directory") from e
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise JournalLocked(
                f"journal {self.path} is already being written by another process",
                "only one supervisor may run per campaign; stop the other one first",
            ) from None
        if created:
            os.fchmod(self._fd, 0o600)
            os.fsync(self._fd)
            _fsync_dir(self.path)
        self._seal_torn_tail()

    def _seal_torn_tail(self) -> None:
        size = os.fstat(self._fd).st_size
        if size == 0:
            return
        with open(self.path, "rb") as f:
            f.seek(max(0, size - 65536))
            tail = f.read()
        last_ok = _decode(tail.rstrip(b"\n").rsplit(b"\n", 1)[-1]) is not None
        if last_ok:
            if not tail.endswith(b"\n"):  # complete event, only the newline was lost
                self._write(b"\n")
            return
        cut = tail.rstrip(b"\n").rfind(b"\n")
        if cut < 0 and len(tail) < size:  # a last line longer than the tail window: find its start the slow way
            with open(self.path, "rb") as f:
                tail = f.read()
            cut = tail.rstrip(b"\n").rfind(b"\n")
        last_start = size - len(tail) + cut + 1
        if not tail.endswith(b"\n"):
            self._write(b"\n")
        self._write(encode({"type": RESUMED, "torn_offset": last_start}, self._clock()))

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)

    def append(self, event: Mapping[str, Any]) -> Event:
        """Append one event durably (written and fsynced when this returns); returns the stored record."""
        line = encode(event, self._clock())
        self._write(line)
        return json.loads(line)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing releases the flock
            self._fd = -1

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

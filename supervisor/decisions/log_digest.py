"""The launch log's evidence, scanned as it grows: the earliest error lines of each srun task and of the whole log,
the lines srun and Slurm wrote themselves, and torchrun's own report lines, in bounded memory. Pure: bytes in,
lines out (the driver's ``LaunchLog`` reads the file and adds its last 64 KiB).

Why: the root-cause line comes first. At 1,000+ ranks a fault is followed by every peer's NCCL watchdog trace, and a
tail of the log holds only those: the verdict became a communication error. Here the first error lines of every
task are kept whatever follows, and the first ``FIRST_LINES`` error lines of the whole log, so the first failing
rank's line decides (``classify`` weighs every kept line; priorities, not order, pick the class).

What a task keeps: its first ``per_task_lines`` error lines, and none after the ``window`` lines of its own that
follow its first one (a rank's first error is followed by its trace; a Python traceback's frame and source lines
do not count, so the exception line that ends a deep traceback is still read).

How it stays fast: each line costs a label lookup; a task that is done is skipped there. A line of a task still
reading passes a few substring tests (``TRIGGERS``, lower-cased: every match of a built-in signature contains one
of its signature's; tests/unit/test_log_digest.py generates matches and checks) before only the signatures it can
match run. Once every task is done and the overall first lines are kept, labelled lines are not split at all: one
regular expression over the chunk finds the unlabelled lines (srun's and Slurm's) and the lines of the few tasks
still reading, and substring search torchrun's report lines (bench/bench_log_scan.py: a 4,096-rank, 200 MB log).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from supervisor.decisions.log_signatures import DEFAULT_LOG_SIGNATURES, MATCH_CHARS, LogSignature
from supervisor.decisions.tasklog import rank_of, strip_label

LINE_CAP = MATCH_CHARS + 16  # bytes kept of one line: its label and the part the signatures look at
PARTIAL_CAP = 1 << 16  # an unfinished line longer than this is cut (the rest, up to its \n, is dropped)
TOTAL_BYTES = 16 << 20  # what the per-task error lines may hold together
FIRST_LINES = 256  # error lines kept in log order whatever their task
UNLABELLED_LINES = 512  # srun's, slurmstepd's and Slurm's own lines kept from the start (as many error lines after)
MARKED_LINES = 4096  # torchrun's report lines (its restarts are counted from them)
FEW_TASKS = 64  # at most this many tasks still reading: their lines are found by one regular expression
_DONE = (-1, -1, -1)  # a task's state once it has its lines

# torchrun's own report lines, read by ``tasklog`` (its restarts, its failure summary) wherever they are in the log.
MARKERS = (b"exitcode", b"Root Cause (first observed failure)", b"(local_rank: ")

# For each built-in signature, lower-cased substrings one of which each of its matches contains (a match of the
# pattern on the decoded line; tests/unit/test_log_digest.py generates matches and checks). A line without any
# runs no regular expression; a user's signature has none, so it runs on every line of a task still reading.
TRIGGERS: dict[str, tuple[str, ...]] = {
    "slurm-preempted": ("cancelled at",),
    "slurm-time-limit": ("cancelled at",),
    "slurm-node-fail": ("cancelled at",),
    "slurm-launch-failed": ("communication connection failure",),
    "slurm-node-failure": ("due to failure of node",),
    "slurm-comm-failure": ("communication connection failure",),
    "cuda-oom": ("out of memory", "outofmemoryerror"),
    "cuda-device-assert": ("device-side assert", "cudaerrorassert", "cuda_error_assert", "assertion"),
    "xid": ("xid",),
    "gpu-lost": ("fallen off the bus", "gpu is lost", "gpu lost"),
    "ecc": ("ecc error", "double bit error", "nvlink error"),
    "cuda-illegal-access": ("illegal", "launch failure", "launch_failed", "launchfailure", "misaligned address"),
    "nccl-cuda-error": ("unhandled cuda error", "unhandledcudaerror"),
    "nccl-system-error": ("unhandled system error", "ncclsystemerror"),
    "cuda-error": ("cuda error", "cuda_error_", "cudaerror"),
    "nccl-invalid-usage": ("ncclinvalidusage", "invalid usage"),
    "nccl-watchdog": ("watchdog caught collective operation timeout",),
    "nccl-remote": ("remote process exit", "ncclremoteerror"),
    "nccl": ("nccl warn", "nccl error", "ncclinternalerror"),
    "peer-closed": ("connection closed by", "connection reset by peer", "connection refused", "broken pipe"),
    "gloo": ("gloo",),
    "dist-network": ("distnetworkerror", "distbackenderror", "c10d"),
    "disk-full": ("no space left on device", "disk quota exceeded", "unexpected pos",
                  "pytorchstreamwriter failed writing"),
    "segfault": ("segmentation fault", "fatal python error"),
    "traceback": ("traceback (most recent call last)",),
    "python-exception": ("error: ", "exception: "),
}  # fmt: skip
# ... or ends with one of these (a Python exception line with no message: ``ValueError`` alone).
ENDINGS: dict[str, tuple[str, ...]] = {"python-exception": ("error", "exception")}

_TRACEBACK_LINES = (b'  File "', b"    ")
# A run of one task's C++ stack frames (``  3: frame #7: ...`` lines): matched whole, one call instead of a loop.
_FRAME_RUN = re.compile(rb"(?P<label>[ 0-9]{1,8}: frame #)[^\n]*\n(?:(?P=label)[^\n]*\n)*")
_NO_DIGITS = str.maketrans("", "", "0123456789")
_SHIELDED = str.maketrans("0123456789", "".join(chr(0xE000 + d) for d in range(10)))  # digits kept as non-digits
# Trigger words that hold digits (``c10d``): their digits are shielded, not dropped, when a line's digits are.
_DIGIT_WORDS = tuple(sorted({t for ts in TRIGGERS.values() for t in ts if any(c.isdigit() for c in t)}))


def digit_free(text: str) -> str:
    """``text`` with its digits left out, except inside trigger words that hold digits (shielded there). A trigger
    word of ``text`` is one of ``digit_free(text)`` (shielded likewise): whole words are shielded, and leaving a
    digit out elsewhere never breaks a word that holds none."""
    for word in _DIGIT_WORDS:
        if word in text:
            text = text.replace(word, word.translate(_SHIELDED))
    return text.translate(_NO_DIGITS)
CANDIDATE_CACHE = 4096  # lines (digits left out) whose candidate signatures are remembered  # a Python traceback's frame line and the source line under it
_UNLABELLED = re.compile(rb"\n(?! *[0-9]{1,7}: )")  # the start of a line srun did not label


def _body(line: bytes, colon: int) -> bytes:
    """A labelled line's text without srun's label and torch's ``[rankN]:`` prefix (what ``classify`` matches)."""
    body = line[colon + 2 :]
    if body.startswith(b"[rank"):
        end = body.find(b"]:", 5, 16)
        if end > 0:
            body = body[end + 2 :]
            if body[:1] == b" ":
                body = body[1:]
    return body


def _trie(words: Sequence[str]) -> str:
    """A regular expression matching any of ``words``, as a trie (``e(?:cc error|rror: )``): ``re`` tries the
    alternatives of a plain ``a|b|c`` one by one at each position, a trie only those sharing the next letter. Any
    word is enough, so where a shorter word ends the longer ones are not spelled out."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        if "" in node:
            return ""
        branches = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items())]
        return branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"

    return emit(root)


Check = tuple[LogSignature, tuple[str, ...], tuple[str, ...]]  # a signature, its triggers, its endings


def _checks(signatures: Sequence[LogSignature]) -> tuple[list[Check], re.Pattern[str] | None, tuple[str, ...]]:
    """(signature, triggers, endings) in table order, the gate (any trigger; None: a user's signature has none, every
    line is a candidate) and every ending."""
    checks: list[Check] = []
    words: set[str] = set()
    endings: set[str] = set()
    user = False
    for sig in signatures:
        if sig.name.startswith("user-") or sig.name not in TRIGGERS:
            user = True
            checks.append((sig, (), ()))
            continue
        triggers = tuple(digit_free(t) for t in TRIGGERS[sig.name])  # as the lines they are tried on
        ends = tuple(digit_free(e) for e in ENDINGS.get(sig.name, ()))
        checks.append((sig, triggers, ends))
        words.update(triggers)
        endings.update(ends)
    gate = None if user else re.compile(_trie(sorted(words)))
    return checks, gate, tuple(sorted(endings))


class LogDigest:
    """Feed the launch log's bytes in order (``feed``); ``lines()`` is what to judge, in log order.

    ``tasks``: how many srun tasks the launch has (None: unknown, the scan never skims). ``ranks_per_task``: one
    under plain srun, a node's ranks under ``srun torchrun`` (a task's lines then interleave its ranks' lines).
    ``signatures``: the campaign's (the user's come first). ``markers``: whether torchrun's report lines are looked
    for (False only when the launch is known to run no torchrun: a plain ``python train.py``; they cost a third of
    a skimming pass)."""

    def __init__(self, signatures: Sequence[LogSignature] = DEFAULT_LOG_SIGNATURES, *, tasks: int | None = None,
                 ranks_per_task: int = 1, total_bytes: int = TOTAL_BYTES, markers: bool = True) -> None:  # fmt: skip
        self.signatures = tuple(signatures)
        self.checks, self.gate, self.endings = _checks([s for s in self.signatures if not s.slurm])
        self.unlabelled_checks, self.unlabelled_gate, self.unlabelled_endings = _checks(self.signatures)
        self.tasks = tasks if tasks and tasks > 0 else None
        rpt = max(1, ranks_per_task)
        self.per_task_lines = 8 * rpt
        self.window = 16 * rpt
        self.per_task_bytes = max(1024, min(8192 * rpt, total_bytes // (self.tasks or 2048)))
        self.offset = 0  # bytes fed so far
        self.partial = b""  # the unfinished last line
        self.partial_start = 0  # its offset
        self.partial_cut = False  # the unfinished line was longer than PARTIAL_CAP: the rest is dropped
        self.kept: dict[int, str] = {}  # offset -> line (decoded, at most LINE_CAP bytes of it)
        self.state: dict[int, tuple[int, int, int]] = {}  # task -> (error lines, bytes kept, lines since the first)
        self.done = 0  # tasks that have their lines
        self.first = 0  # error lines kept in log order whatever their task (FIRST_LINES)
        self.unlabelled = 0
        self.marked: dict[int, str] = {}  # offset -> a torchrun report line
        self.labels: dict[bytes, int] = {}  # srun's label text -> task id (a cache: parsing is the hot path)
        self.skim_for: tuple[int, ...] | None = None  # the tasks the skim regex looks for
        self.skim_re = _UNLABELLED
        self.lines_scanned = 0
        self.with_markers = markers
        # Which checks a line can match depends only on its trigger words and endings, which hold no digit: lines
        # that differ only in numbers (ranks, sequence numbers, times) share it (see _candidates).
        self.candidates: dict[tuple[bool, str], tuple[LogSignature, ...]] = {}

    # ------------------------------------------------------------------ feeding

    def feed(self, data: bytes) -> None:
        """The next bytes of the log."""
        base = self.offset  # where ``data`` begins in the log
        self.offset += len(data)
        pos = 0
        if self.partial or self.partial_cut:  # finish the line the last bytes left open
            nl = data.find(b"\n")
            if nl < 0:
                self._grow_partial(data, base)
                return
            self._grow_partial(data[:nl], base)
            self._line(self.partial, self.partial_start)
            self.partial, self.partial_cut = b"", False
            pos = nl + 1
        end = data.rfind(b"\n") + 1
        if end > pos:
            self._lines(data, pos, end, base)
            pos = end
        if pos < len(data):
            self._grow_partial(data[pos:], base + pos)

    def finish(self) -> None:
        """The log ended: its unfinished last line counts."""
        if self.partial:
            self._line(self.partial, self.partial_start)
            self.partial, self.partial_cut = b"", False

    def _grow_partial(self, data: bytes, at: int) -> None:
        if not data or self.partial_cut:
            return
        if not self.partial:
            self.partial_start = at
        self.partial += data
        if len(self.partial) > PARTIAL_CAP:
            self.partial, self.partial_cut = self.partial[:PARTIAL_CAP], True

    def _skimming(self) -> bool:
        """Few tasks still read and the overall first lines are kept: the other labelled lines can be skipped."""
        return self.tasks is not None and self.done >= self.tasks - FEW_TASKS and self.first >= FIRST_LINES

    def _lines(self, data: bytes, lo: int, hi: int, base: int) -> None:
        """``data[lo:hi]``: whole lines, each ending in ``\\n``; ``base``: the log offset of ``data[0]``."""
        if self._skimming():
            self._skim(data, lo, hi, base)
            return
        pos = lo
        labels, state, find = self.labels, self.state, data.find
        while pos < hi:
            end = find(b"\n", pos, hi)
            colon = find(b": ", pos, pos + 12)
            task = labels.get(data[pos:colon], -1) if colon > pos else -1
            if task >= 0 and state.get(task) is _DONE and self.first >= FIRST_LINES:
                # A done task's lines: skip its run of lines (a task's output comes in runs), minding the markers.
                label = data[pos : colon + 2]
                run_end = end + 1
                while data.startswith(label, run_end, hi):
                    run_end = find(b"\n", run_end, hi) + 1
                self._markers(data, pos, run_end, base)
                pos = run_end
                continue
            if task >= 0 and data.startswith(b"frame #", colon + 2, end):
                # A run of C++ stack frames (torch's ``frame #3: c10d::...``): counted, never an error line.
                run = _FRAME_RUN.match(data, pos, hi)
                run_end = run.end() if run is not None and run.end() > end else end + 1
                frames = data.count(b"\n", pos, run_end)
                self._count(task, frames)
                self.lines_scanned += frames
                pos = run_end
                continue
            self._line(data[pos:end], base + pos)
            pos = end + 1
            if self.done >= (self.tasks or 1 << 62) - FEW_TASKS and self._skimming():
                self._skim(data, pos, hi, base)
                return

    def _skim(self, data: bytes, lo: int, hi: int, base: int) -> None:
        """Only the unlabelled lines, the lines of the tasks still reading, and torchrun's report lines."""
        pattern = self._skim_pattern()
        if pattern is not None and lo < hi:
            first = data[lo : min(hi, lo + 16)]
            starts = [lo] if self._task(first) is None or not self._is_done(first) else []
            starts += [m.start() + 1 for m in pattern.finditer(data, lo, hi - 1)]
            for s in starts:
                e = data.find(b"\n", s, hi)
                self._line(data[s:e], base + s)
        self._markers(data, lo, hi, base)

    def _markers(self, data: bytes, lo: int, hi: int, base: int) -> None:
        """torchrun's report lines in ``data[lo:hi]`` (whole lines)."""
        if not self.with_markers:
            return
        for marker in MARKERS:
            at = data.find(marker, lo, hi)
            while at >= 0 and len(self.marked) < MARKED_LINES:
                s = data.rfind(b"\n", lo, at) + 1 or lo
                e = data.find(b"\n", at, hi)
                self._mark(data[max(s, lo) : e], base + max(s, lo))
                at = data.find(marker, e, hi)

    def _skim_pattern(self) -> re.Pattern[bytes] | None:
        """The start of an unlabelled line or of a line of a task still reading (None: nothing to look for)."""
        reading = tuple(t for t in range(self.tasks or 0) if self.state.get(t) is not _DONE)
        if reading != self.skim_for:
            self.skim_for = reading
            labels = b"|".join(str(t).encode() for t in reading)
            self.skim_re = re.compile(rb"\n(?: *(?:" + labels + rb"): |(?! *[0-9]{1,7}: ))") if reading else _UNLABELLED
        if not reading and self.unlabelled >= UNLABELLED_LINES * 2:
            return None
        return self.skim_re

    def _is_done(self, line: bytes) -> bool:
        task = self._task(line)
        return task is not None and self.state.get(task) is _DONE

    # ------------------------------------------------------------------ one line

    def _task(self, line: bytes) -> int | None:
        """srun's task label (``"  3: ..."``), None for a line it did not label."""
        colon = line.find(b": ", 0, 12)
        if colon <= 0:
            return None
        head = line[:colon]
        task = self.labels.get(head)
        if task is None:
            digits = head.lstrip(b" ")
            if not digits.isdigit():
                return None
            task = int(digits)
            if len(self.labels) < 1 << 16:
                self.labels[head] = task
        return task

    def _line(self, line: bytes, offset: int) -> None:
        self.lines_scanned += 1
        colon = line.find(b": ", 0, 12)
        task = self.labels.get(line[:colon]) if colon > 0 else None
        if task is None:
            task = self._task(line)
            if task is None:
                self._unlabelled_line(line, offset)
                return
        if self.with_markers and (b"exitcode" in line or b"Root Cause" in line or b"(local_rank: " in line):
            self._mark(line, offset)
        state = self.state.get(task)
        if state is _DONE and self.first >= FIRST_LINES:
            return
        body = _body(line[:LINE_CAP], colon)
        if body.startswith(_TRACEBACK_LINES):
            return  # a Python traceback's frame or source line: neither an error line nor counted
        errors, kept, since = state if state is not None and state is not _DONE else (0, 0, -1)
        if since >= 0:
            since += 1
        if body.startswith(b"frame #"):  # a C++ stack frame (torch's ``frame #3: c10d::...``): counted, not read
            text = None
        else:
            text = self._error_text(line, body)
        if text is not None:
            self.kept[offset] = text
            self.first += self.first < FIRST_LINES
            if state is _DONE:
                return
            errors, kept, since = errors + 1, kept + len(text), max(since, 0)
        elif state is _DONE or since < 0:
            return
        if errors >= self.per_task_lines or kept >= self.per_task_bytes or since > self.window:
            self.state[task] = _DONE
            self.done += 1
        else:
            self.state[task] = (errors, kept, since)

    def _count(self, task: int, lines: int) -> None:
        """``lines`` lines of ``task`` that are not error lines."""
        state = self.state.get(task)
        if state is None or state is _DONE or state[2] < 0:
            return
        errors, kept, since = state
        if since + lines > self.window:
            self.state[task] = _DONE
            self.done += 1
        else:
            self.state[task] = (errors, kept, since + lines)

    def _unlabelled_line(self, line: bytes, offset: int) -> None:
        if self.unlabelled >= UNLABELLED_LINES * 2:
            return
        if self.unlabelled >= UNLABELLED_LINES and self._error_text(line, line, labelled=False) is None:
            return  # past the first ones, only the unlabelled error lines
        self.unlabelled += 1
        self.kept[offset] = line[:LINE_CAP].decode(errors="replace")

    def _mark(self, line: bytes, offset: int) -> None:
        if len(self.marked) < MARKED_LINES:
            self.marked[offset] = line[:LINE_CAP].decode(errors="replace")

    def _error_text(self, line: bytes, body: bytes, labelled: bool = True) -> str | None:
        """The line (decoded, capped) if a signature matches its body (as ``classify`` will), else None."""
        text = body[:LINE_CAP].decode(errors="replace")[:MATCH_CHARS]
        exact = None  # the text exactly as ``classify`` cuts it (its own label and prefix rules), made when needed
        for sig in self._candidates(text.lower(), labelled):
            if sig.pattern.search(text):
                return line[:LINE_CAP].decode(errors="replace")
            if exact is None:
                exact = rank_of(strip_label(line[:LINE_CAP].decode(errors="replace")))[1][:MATCH_CHARS]
            if exact != text and sig.pattern.search(exact):
                return line[:LINE_CAP].decode(errors="replace")
        return None

    def _candidates(self, low: str, labelled: bool) -> tuple[LogSignature, ...]:
        """The signatures, in table order, whose trigger words (or endings) ``low`` has: only these can match it.
        Judged on, and remembered for, the line with its digits left out (:func:`digit_free`, the triggers taken
        the same way): that keeps every trigger word the line has and can only join new ones, so the set holds
        every signature the line itself has the triggers of (one more signature tried costs a search, never a
        verdict), and lines that differ only in their numbers share it."""
        key = (labelled, digit_free(low))
        found = self.candidates.get(key)
        if found is not None:
            return found
        low = key[1]
        checks, gate, endings = (self.checks, self.gate, self.endings) if labelled else \
            (self.unlabelled_checks, self.unlabelled_gate, self.unlabelled_endings)  # fmt: skip
        if gate is not None and gate.search(low) is None and not low.endswith(endings):
            picked: tuple[LogSignature, ...] = ()
        else:
            picked = tuple(sig for sig, triggers, ends in checks
                           if not triggers or any(t in low for t in triggers) or (ends and low.endswith(ends)))  # fmt: skip
        if len(self.candidates) >= CANDIDATE_CACHE:
            self.candidates.clear()
        self.candidates[key] = picked
        return picked

    # ------------------------------------------------------------------ reading

    def lines(self) -> list[tuple[int, str]]:
        """(offset, line) of every kept line, in log order (torchrun's report lines included)."""
        return sorted({**self.kept, **self.marked}.items())

    def markers(self) -> list[str]:
        """torchrun's report lines, in log order."""
        return [text for _, text in sorted(self.marked.items())]

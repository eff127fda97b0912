"""Which rank a stall waits for, from the ranks' stacks. Pure: dump text in, ranks out.

Why: in data-parallel training one stuck rank soon stalls everyone, and when the stuck rank beat for the same step
as its peers (it hung after its beat; they wait for it in the next collective) the heartbeats cannot tell it
from them: every rank is silent on one step. Its stack can: the peers are inside ``torch.distributed`` (a
collective, a barrier, a wait, a store lookup) or inside autograd's backward (where DDP and FSDP reduce
gradients), the stuck rank is somewhere else (a dead-locked lock, a stuck data loader, a ``time.sleep``, a kernel
that never returns). A rank that is not waiting while peers wait for something is what they wait for.

Complete evidence only: a candidate whose stack is missing or unreadable names nobody (that rank might be the
one, or another without a stack), and nobody is named without at least one peer seen waiting, nor when the ranks
not waiting outnumber those waiting (that is not one odd rank but a broken collective).

Two dump formats, both untrusted text (a rank's own process wrote one of them): Python's faulthandler (the
client's dump signal: ``Thread 0x... (most recent call first):`` then ``  File "x.py", line 3 in f``) and py-spy's
``dump`` (``Thread 123 (idle): "MainThread"`` then ``    f (x.py:3)``, native frames too with ``--native``).
The parser reads at most ``MAX_TEXT`` characters and ``MAX_FRAMES`` frames per thread and never raises.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

MAX_TEXT = 1 << 20
MAX_FRAMES = 256
MAX_THREADS = 512

_FH_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-fA-F]{1,16}) \(most recent call first\):")
_FH_FRAME = re.compile(r'^  File "(?P<file>[^"\n]{0,1024})", line (?P<line>\d{1,9}) in (?P<func>\S{1,512})')
_SPY_THREAD = re.compile(r'^Thread (\d{1,12})(?: \(([a-z-]{1,16})\))?(?:: "(?P<name>[^"\n]{0,256})")?')
_SPY_FRAME = re.compile(r"^    (?P<func>.{1,512}?) \((?P<file>[^()\n]{0,1024}?)(?::(?P<line>\d{1,9}))?\)\s*$")

# Where a rank waits for its peers. Python: torch.distributed (collectives, barriers, Work.wait, the rendezvous
# store), autograd's backward (DDP's reducer and FSDP's hooks all-reduce and reduce-scatter there).
_WAITING_FILES = ("torch/distributed/", "torch\\distributed\\")
_BACKWARD = (("torch/autograd/graph.py", "_engine_run_backward"), ("torch/autograd/__init__.py", "backward"),
             ("torch/_tensor.py", "backward"))  # fmt: skip
_WAITING_NATIVE = ("c10d::", "gloo::", "ProcessGroup", "ncclGroupEnd", "ncclAllReduce", "ncclKernel")
_THREAD_START = ("threading.py",)


@dataclass(frozen=True)
class Frame:
    func: str
    file: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.func} ({self.file}{'' if self.line is None else f':{self.line}'})"


@dataclass(frozen=True)
class Thread:
    ident: str
    name: str | None
    frames: tuple[Frame, ...]  # innermost first

    @property
    def is_main(self) -> bool:
        """py-spy names it; in faulthandler's dump the main thread is the one not started by ``threading``."""
        if self.name is not None:
            return self.name == "MainThread"
        return bool(self.frames) and not self.frames[-1].file.endswith(_THREAD_START)


@dataclass(frozen=True)
class Stack:
    threads: tuple[Thread, ...]

    @property
    def main(self) -> Thread | None:
        mains = [t for t in self.threads if t.is_main]
        return mains[0] if len(mains) == 1 else None


def parse(text: str) -> Stack:
    """A faulthandler or py-spy dump -> its threads (none when the text is neither)."""
    threads: list[Thread] = []
    ident, name, frames = None, None, []  # type: ignore[var-annotated]

    def close() -> None:
        if ident is not None and len(threads) < MAX_THREADS:
            threads.append(Thread(ident, name, tuple(frames)))

    for line in text[:MAX_TEXT].split("\n"):
        line = line.rstrip("\r")
        m = _FH_THREAD.match(line)
        s = None if m else _SPY_THREAD.match(line)
        if m or s:
            close()
            ident, name, frames = (m.group(1), None, []) if m else (s.group(1), s.group("name"), [])  # type: ignore[union-attr]
            continue
        if ident is None or len(frames) >= MAX_FRAMES:
            continue
        f = _FH_FRAME.match(line) or _SPY_FRAME.match(line)
        if f is not None:
            number = f.group("line")
            frames.append(Frame(f.group("func"), f.group("file"), int(number) if number else None))
    close()
    return Stack(tuple(threads))


def waiting_place(stack: Stack) -> Frame | None | bool:
    """The frame where the main thread waits for peers; False when it is not waiting; None when unknown (no
    single main thread with frames)."""
    main = stack.main
    if main is None or not main.frames:
        return None
    for frame in main.frames:
        if any(part in frame.file for part in _WAITING_FILES) or any(part in frame.func for part in _WAITING_NATIVE):
            return frame
        if any(frame.file.endswith(file) and frame.func.rsplit(".", 1)[-1] == func for file, func in _BACKWARD):
            return frame
    return False


def where(stack: Stack) -> str:
    """The main thread's innermost frame, for the evidence."""
    main = stack.main
    return str(main.frames[0]) if main is not None and main.frames else "unknown"


@dataclass(frozen=True)
class StallVerdict:
    """``named``: the ranks the others wait for (empty: nobody can be named); ``evidence``: why, one line each."""

    named: tuple[int, ...]
    evidence: tuple[str, ...]


def odd_ranks(candidates: Iterable[int], stacks: Mapping[int, Stack | None]) -> StallVerdict:
    """Among ``candidates`` (ranks past their own phase's timeout), the ones not waiting for peers while peers
    wait; ``stacks``: every rank whose stack was asked for (None: no stack came)."""
    wanted = sorted(set(candidates))
    places = {rank: (None if stack is None else waiting_place(stack)) for rank, stack in stacks.items()}
    missing = [r for r in wanted if places.get(r) is None]
    if missing:
        return StallVerdict((), (f"no usable stack from rank(s) {_ranks(missing)}: nobody is named",))
    waiting = sorted(r for r, p in places.items() if isinstance(p, Frame))
    out = [r for r in wanted if places[r] is False]
    if not out:
        return StallVerdict((), (f"every rank past its timeout waits for peers ({_ranks(wanted)})",))
    if not waiting:
        return StallVerdict((), (f"no rank is seen waiting for peers: rank(s) {_ranks(out)} are not the odd ones",))
    if len(out) > len(waiting):
        return StallVerdict((), (f"more ranks are outside a collective ({len(out)}) than inside ({len(waiting)})",))
    example = places[waiting[0]]
    evidence = tuple(
        f"rank {r} is not waiting for its peers: its stack is at {where(stacks[r])}"  # type: ignore[arg-type]
        for r in out[:16]
    ) + (f"rank(s) {_ranks(waiting)} wait for peers, e.g. at {example}",)
    return StallVerdict(tuple(out), evidence)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks[:16]) + (f" and {len(ranks) - 16} more" if len(ranks) > 16 else "")

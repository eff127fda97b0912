"""Single-file checkpoints (Lightning ``*.ckpt``, ``torch.save`` files): found, ordered and checked unpickled.

Why: Lightning and plain PyTorch programs save one file per checkpoint (``epoch=3-step=1200.ckpt``,
``last.ckpt``, ``hpc_ckpt_2.ckpt``, ``checkpoint-1200.pt``); a store that sees only directories would
always resume them from step 0. What can be checked without unpickling (the supervisor never does):

- the modern ``torch.save`` format is a zip archive (stored, not compressed): the quick check reads its
  central directory (every member inside the file, one ``*/data.pkl`` record, the pickle's opcode stream
  parses); the full check also reads every member and compares its CRC-32 (``zipfile``).
- the legacy format (``_use_new_zipfile_serialization=False``) is a bare pickle stream: only "non-empty
  and starts with a pickle protocol header" can be said.

A name without a step (``last.ckpt``) gets the ``global_step`` recorded in the pickle, read from the
opcode stream with ``pickletools.genops`` (decoded, never executed).
"""

from __future__ import annotations

import os
import pickletools
import re
import zipfile
import zlib
from dataclasses import dataclass

SUFFIXES = (".ckpt", ".pt", ".pth")
MAX_PICKLE_BYTES = 64 << 20  # data.pkl holds structure only (tensor bytes are separate records)

_STEP_PATTERNS = (
    re.compile(r"(?:^|[^a-z])step[=_-]?(\d+)", re.IGNORECASE),  # epoch=3-step=1200, step-00000040, step_5
    re.compile(r"(?:checkpoint|ckpt|iter|iteration|model|hpc_ckpt)[_-]?(\d+)", re.IGNORECASE),
)


_INT_OPS = frozenset({"INT", "LONG", "BININT", "BININT1", "BININT2", "LONG1", "LONG4"})
_MEMO_OPS = frozenset({"PUT", "BINPUT", "LONG_BINPUT", "MEMOIZE", "GET", "BINGET", "LONG_BINGET", "FRAME"})


class FormatError(ValueError):
    """The file is not a readable checkpoint of a known format (torn, truncated, corrupt)."""


@dataclass(frozen=True)
class FileCheck:
    kind: str  # "torch-zip" | "torch-legacy"
    step: int | None  # from the pickle's global_step, when the name has none
    detail: str  # what was checked


def is_candidate(name: str) -> bool:
    return name.lower().endswith(SUFFIXES) and not name.startswith(".")


def step_from_file_name(name: str) -> int | None:
    stem = name.rsplit(".", 1)[0]
    for pattern in _STEP_PATTERNS:
        match = pattern.search(stem)
        if match:
            return int(match.group(1))
    return None


def global_step_in_pickle(data: bytes) -> int | None:
    """The int that follows the key ``global_step`` in a pickle stream (Lightning's checkpoint dict), if any."""
    want = False
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in _MEMO_OPS:  # memo bookkeeping between the key and its value
                continue
            if want and op.name in _INT_OPS and isinstance(arg, int):
                return arg if arg >= 0 else None
            want = isinstance(arg, str) and arg == "global_step"
    except Exception:  # noqa: BLE001 - any decoding failure of untrusted bytes only means "not found"
        return None
    return None


def _pickle_ok(data: bytes) -> None:
    try:
        for _ in pickletools.genops(data):
            pass
    except Exception as err:  # noqa: BLE001 - a torn or hostile stream is a format defect
        raise FormatError(f"the pickle stream does not parse ({err.__class__.__name__}: {str(err)[:120]})") from None


def check_file(path: str | os.PathLike[str], full: bool = False) -> FileCheck:
    """Check a single-file checkpoint as far as its format allows; raises FormatError when it is unusable."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as err:
        raise FormatError(f"cannot be read ({err.strerror})") from None
    if size == 0:
        raise FormatError("is empty")
    if head.startswith(b"PK"):
        return _check_zip(path, size, full)
    if head[:1] == b"\x80":
        return FileCheck("torch-legacy", None, "legacy torch.save pickle: only its header can be checked")
    raise FormatError("is neither a torch zip archive nor a pickle stream")


def _check_zip(path: str | os.PathLike[str], size: int, full: bool) -> FileCheck:
    try:
        with zipfile.ZipFile(path) as zf:
            infos = zf.infolist()
            pickles = [i for i in infos if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
            if len(pickles) != 1:
                raise FormatError(f"torch zip archive has {len(pickles)} data.pkl records (1 expected)")
            for info in infos:
                if info.header_offset + info.compress_size > size:
                    raise FormatError(f"torch zip member {info.filename!r} runs past the end of the file (torn)")
            if pickles[0].file_size > MAX_PICKLE_BYTES:
                raise FormatError(f"data.pkl is larger than {MAX_PICKLE_BYTES} bytes")
            data = zf.read(pickles[0])
            _pickle_ok(data)
            detail = "torch zip archive: structure and data.pkl checked"
            if full:
                bad = zf.testzip()
                if bad is not None:
                    raise FormatError(f"torch zip member {bad!r} fails its CRC-32 (corrupt)")
                detail = f"torch zip archive: every member's CRC-32 checked ({len(infos)} members)"
    except FormatError:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError, NotImplementedError,
            RuntimeError, OverflowError, zlib.error) as err:  # zlib.error: a member whose deflate stream is torn
        raise FormatError(f"torch zip archive is damaged ({err.__class__.__name__}: {str(err)[:120]})") from None
    return FileCheck("torch-zip", global_step_in_pickle(data), detail)

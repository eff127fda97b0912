"""``supervise checkpoints DIR [--verify] [--json] [--campaign C]``: list checkpoints with their status, newest first.

With ``--campaign`` manifests signed with that campaign's key are recognised as its own; without it, every
checkpoint counts as foreign, adopted only from a private root (docs/security.md).

Exit 0 when a usable checkpoint exists (valid, or an adopted DCP layout that passed its structural
checks), 6 when none does. Read-only unless ``--quarantine`` is given.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.errors import CheckpointError, UsageError

if TYPE_CHECKING:
    from supervisor.checkpoint.store import CheckpointInfo

HELP = "list and verify checkpoints in a directory"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dir", metavar="DIR", help="checkpoint root (the training program's --ckpt-dir)")
    parser.add_argument("--verify", action="store_true",
                        help="also check every file's hash (reads all data; default: manifest, files and sizes)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--campaign", metavar="C",
                        help="campaign directory whose secret authenticates the manifests (see docs/security.md)")
    parser.add_argument("--quarantine", action="store_true",
                        help="move invalid checkpoints into DIR/quarantine/ (with a reason file; never deletes)")


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def human_age(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = max(0.0, seconds)
    for limit, unit in ((120, "s"), (7200, "m"), (172800, "h")):
        if seconds < limit:
            return f"{seconds / {'s': 1, 'm': 60, 'h': 3600}[unit]:.0f}{unit}"
    return f"{seconds / 86400:.0f}d"


def run(args: argparse.Namespace) -> int:
    from supervisor.checkpoint.store import CheckpointStore
    from supervisor.checkpoint.validate import INVALID

    root = Path(args.dir)
    if not root.is_dir():
        what = "does not exist" if not root.exists() else "is not a directory"
        raise UsageError(f"checkpoint directory {str(root)!r} {what}", "pass the training program's --ckpt-dir")
    if not os.access(root, os.R_OK | os.X_OK):
        raise UsageError(f"checkpoint directory {str(root)!r} is not readable", "check its permissions")
    from supervisor.checkpoint.trust import campaign_key

    store = CheckpointStore(root, key=campaign_key(getattr(args, "campaign", None)))
    infos = store.list(full=args.verify)
    if args.quarantine:
        for info in infos:
            if info.status == INVALID:
                store.quarantine(info.path, info.reason)
    usable = next((i for i in infos if i.status in ("valid", "unverified")), None)
    quarantined = store.quarantined()
    if args.json:
        print(json.dumps({
            "root": str(root),
            "verified_hashes": bool(args.verify),
            "newest_valid": usable.to_json() if usable else None,
            "checkpoints": [i.to_json() for i in infos],
            "quarantined": [{"path": str(q.path), "reason": q.reason} for q in quarantined],
        }, indent=1))
    else:
        _print_table(infos, usable, len(quarantined))
    if usable is None:
        raise CheckpointError(f"no valid checkpoint in {str(root)!r}",
                              "start fresh, or check the reasons listed above" if infos else "start fresh")
    return 0


def _print_table(infos: list[CheckpointInfo], usable: CheckpointInfo | None, n_quarantined: int) -> None:
    now = time.time()
    rows = [("STEP", "AGE", "SIZE", "STATUS", "NAME", "REASON")]
    for i in infos:
        mark = "*" if i is usable else ""
        rows.append((f"{i.step if i.step is not None else '?'}{mark}",
                     human_age(now - i.time if i.time else None), human_size(i.size_bytes),
                     i.status, i.path.name, i.reason))
    widths = [max(len(r[c]) for r in rows) for c in range(5)]
    for r in rows:
        print(("  ".join(r[c].ljust(widths[c]) for c in range(5)) + "  " + r[5]).rstrip())
    if not infos:
        print("(no checkpoints)")
    if n_quarantined:
        print(f"{n_quarantined} quarantined checkpoint(s) in quarantine/")
    if usable is not None:
        print("* newest usable checkpoint")

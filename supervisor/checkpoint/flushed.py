"""The memory tier's snapshot flushed to the filesystem, in the campaign directory: what a requeued job resumes
from when the job stopped (preemption, time limit, ``supervise cancel --checkpoint``) with a snapshot newer than
its newest filesystem checkpoint. No torch, nothing unpickled.

Layout: ``<campaign>/memory-flush/step_N/`` with every rank's ``rank_R.snap`` + ``rank_R.json`` (as in the node
store) and ``snapshot.json``, the manifest: step, world size, the launch that wrote the snapshot, and each rank's
SHA-256, authenticated with the campaign's manifest key (``checkpoint.trust``). The node agents copy the shards
into a hidden staging directory (``.step_N-<token>.partial``); the supervisor writes the manifest when every
rank's shard is there with the digest it expects, then renames the directory into place: all shards and the
manifest, or the flush does not exist. Only the newest flush is kept.

Reading checks the manifest's MAC and each shard's record and size against it; the bytes are hashed by the ranks
that load them (``checkpoint.memory``), which refuse a shard that does not match, so a flush altered after the
commit sends the relaunch to the filesystem checkpoint, never into a damaged state.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from supervisor.checkpoint import trust
from supervisor.decisions.memory_pick import Held
from supervisor.heartbeat.memory_report import DIGEST_CHARS

FLUSH_DIR_NAME = "memory-flush"
MANIFEST = "snapshot.json"
FORMAT = "supervisor-memory-flush/1"
_STEP = re.compile(r"step_(\d+)")
_PARTIAL = re.compile(r"\.step_(\d+)-[0-9a-f]+\.partial")


@dataclass(frozen=True)
class Flushed:
    path: Path
    step: int
    world: int
    launch: str
    held: tuple[Held, ...]  # every rank's shard, as a holder reports it


def flush_root(campaign: str | os.PathLike[str]) -> Path:
    return Path(campaign) / FLUSH_DIR_NAME


def staging(campaign: str | os.PathLike[str], step: int) -> Path:
    """A new staging directory's path (not created: the agents create it; its parent is made private here)."""
    root = flush_root(campaign)
    root.mkdir(mode=0o700, exist_ok=True)
    return root / f".step_{step}-{secrets.token_hex(4)}.partial"


def arrived(directory: Path, digests: Mapping[int, str]) -> dict[int, str]:
    """rank -> the full SHA-256 of each shard in ``directory`` with its record, the recorded size, and a digest
    that begins with the one expected (the agents' reports carry a prefix of it; the copy was hashed in full)."""
    done = {}
    for rank, digest in digests.items():
        try:
            record = json.loads((directory / f"rank_{rank}.json").read_text())
            size = (directory / f"rank_{rank}.snap").stat().st_size
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("size") != size:
            continue
        full = record.get("sha256")
        if isinstance(full, str) and len(full) == 64 and digest and full.startswith(digest):
            done[rank] = full
    return done


def arrived_any(directory: Path, ranks: Iterable[int]) -> dict[int, tuple[int, str, str]]:
    """rank -> (step, launch, full SHA-256) of each shard in a background persist's ``directory`` with its record
    and the recorded size: the agents chose the step (``agent.flush_copy.pin_next``), so no digest is expected
    beforehand; the copy was hashed against the record as it was written."""
    done = {}
    for rank in ranks:
        try:
            record = json.loads((directory / f"rank_{rank}.json").read_text())
            size = (directory / f"rank_{rank}.snap").stat().st_size
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("size") != size or record.get("rank") != rank:
            continue
        step, launch, full = record.get("step"), record.get("launch"), record.get("sha256")
        if type(step) is int and isinstance(launch, str) and isinstance(full, str) and len(full) == 64:
            done[rank] = (step, launch, full)
    return done


def commit(directory: Path, *, step: int, world: int, launch: str, digests: Mapping[int, str],
           key: bytes | None) -> Path:  # fmt: skip
    """Write the manifest into a complete staging ``directory`` and rename it into place; older flushes and
    leftover staging directories go. Returns the committed path."""
    doc = {"format": FORMAT, "step": step, "world": world, "launch": launch}
    sha = {f"rank_{r}.snap": d for r, d in sorted(digests.items())}
    if key is not None:
        doc["auth"] = trust.make_auth(key, doc, sha)
    else:
        doc["sha256"] = sha
    tmp = directory / f".{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps(doc, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / MANIFEST)
    final = directory.parent / f"step_{step}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(directory, final)
    _fsync_dir(final.parent)
    for other in directory.parent.iterdir():
        if other != final and (_STEP.fullmatch(other.name) or _PARTIAL.fullmatch(other.name)):
            shutil.rmtree(other, ignore_errors=True)
    return final


def discard(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)


def newest(campaign: str | os.PathLike[str], key: bytes | None) -> tuple[Flushed | None, str]:
    """(the newest committed flush that checks out, or None; why not)."""
    root = flush_root(campaign)
    try:
        steps = sorted(((int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.fullmatch(p.name))),
                       reverse=True)  # fmt: skip
    except OSError:
        return None, "no flushed snapshot"
    if not steps:
        return None, "no flushed snapshot"
    why = "no flushed snapshot"
    for step, path in steps:
        found, why = read(path, step, key)
        if found is not None:
            return found, ""
    return None, why


def read(path: Path, step: int, key: bytes | None) -> tuple[Flushed | None, str]:
    try:
        doc = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None, f"{path}: no readable manifest"
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or doc.get("step") != step:
        return None, f"{path}: not a flushed snapshot of step {step}"
    world, launch = doc.get("world"), doc.get("launch")
    if type(world) is not int or world <= 0 or not isinstance(launch, str):
        return None, f"{path}: manifest without world size or launch"
    if key is not None:
        if trust.check_auth(doc, doc.get("auth"), key) != trust.SIGNED:
            return None, f"{path}: manifest not signed with this campaign's key"
        sha = doc["auth"]["sha256"]
    else:
        sha = doc.get("sha256")
    if not isinstance(sha, dict):
        return None, f"{path}: manifest without digests"
    listed = {r: sha.get(f"rank_{r}.snap") for r in range(world)}
    digests = {r: d for r, d in listed.items() if isinstance(d, str) and len(d) == 64}
    if len(digests) != world:
        return None, f"{path}: manifest lacks a rank's digest"
    present = arrived(path, digests)
    if len(present) != world:
        return None, f"{path}: {world - len(present)} rank shard(s) missing or altered"
    held = tuple(Held(step, r, world, d[:DIGEST_CHARS], True, launch) for r, d in sorted(present.items()))
    return Flushed(path, step, world, launch, held), ""


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""Manifest format, path confinement, hashing and retention: pure logic, property-tested."""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.checkpoint.hashing import ALGORITHMS, available, hash_file, hash_files
from supervisor.checkpoint.manifest import (
    FileEntry,
    Manifest,
    ManifestError,
    check_relative_path,
    parse_manifest,
)
from supervisor.checkpoint.retention import steps_to_delete

name_part = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_.-", min_size=1, max_size=12).filter(
    lambda s: s not in (".", "..")
)
rel_paths = st.lists(name_part, min_size=1, max_size=4).map("/".join)


def _manifest(paths: list[str]) -> Manifest:
    files = tuple(FileEntry(p, i * 7, f"{i:08x}") for i, p in enumerate(paths))
    return Manifest(step=42, time=1_700_000_000.5, world_size=2, hash_algorithm="crc32", files=files,
                    env={"python": "3.11", "seeds": {"seed": 1}}, extra={"epoch": 3, "offset": 9})


@given(st.lists(rel_paths, max_size=20, unique=True).filter(lambda ps: "manifest.json" not in ps))
def test_manifest_round_trips_through_json(paths: list[str]) -> None:
    m = _manifest(paths)
    assert parse_manifest(m.to_json()) == m


@settings(max_examples=60)
@given(st.integers(min_value=0, max_value=10_000))
def test_any_truncation_of_a_manifest_is_rejected(cut: int) -> None:
    data = _manifest(["__0_0.distcp", ".metadata"]).to_json().rstrip()
    cut = cut % len(data)
    with pytest.raises(ManifestError):
        parse_manifest(data[:cut])


@given(rel_paths)
def test_accepted_paths_stay_inside_the_checkpoint(path: str) -> None:
    try:
        check_relative_path(path)
    except ManifestError:
        return
    joined = posixpath.normpath(posixpath.join("/ckpt", path))
    assert joined.startswith("/ckpt/")


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/etc/passwd", "a/./b", "a//b", "", ".", "a\\..\\b",
                                  "a\x00b", "a/"])
def test_escaping_or_ambiguous_paths_are_rejected(path: str) -> None:
    with pytest.raises(ManifestError):
        check_relative_path(path)


@given(st.lists(st.sampled_from(["..", "a", "b", "."]), min_size=1, max_size=6))
def test_paths_with_dot_components_are_rejected(parts: list[str]) -> None:
    path = "/".join(parts)
    if ".." in parts or "." in parts:
        with pytest.raises(ManifestError):
            check_relative_path(path)
    else:
        assert check_relative_path(path) == path


@pytest.mark.parametrize("mutate, words", [
    (lambda d: d.update(version=99), "version 99"),
    (lambda d: d.update(format="other"), "not a slurm-supervisor-checkpoint"),
    (lambda d: d.update(step="7"), "'step'"),
    (lambda d: d.update(hash_algorithm="md4"), "unknown hash algorithm"),
    (lambda d: d["files"].append(dict(d["files"][0])), "duplicated"),
    (lambda d: d["files"][0].update(size=-1), "bad size"),
    (lambda d: d["files"][0].update(path="../../etc/shadow"), "'..'"),
])
def test_malformed_manifests_say_what_is_wrong(mutate, words: str) -> None:
    doc = json.loads(_manifest(["a.distcp", "b.distcp"]).to_json())
    mutate(doc)
    with pytest.raises(ManifestError, match=words.replace("(", r"\(")):
        parse_manifest(json.dumps(doc).encode())


@pytest.mark.parametrize("algorithm, check", [("crc32", "cbf43926"), ("crc32c", "e3069283")])
def test_crc_check_values(tmp_path: Path, algorithm: str, check: str) -> None:
    if not available(algorithm):
        pytest.skip(f"{algorithm} not installed")
    (tmp_path / "f").write_bytes(b"123456789")  # the standard CRC check input
    assert hash_file(tmp_path / "f", algorithm) == (9, check)


@pytest.mark.parametrize("algorithm", [a for a in ALGORITHMS if a != "crc32c"])
def test_hash_file_matches_the_reference_implementation(tmp_path: Path, algorithm: str) -> None:
    data = os.urandom(3 * (1 << 20) + 12345)  # spans several read chunks
    p = tmp_path / "f"
    p.write_bytes(data)
    expected = {"crc32": f"{zlib.crc32(data):08x}", "sha256": hashlib.sha256(data).hexdigest(),
                "blake2b": hashlib.blake2b(data).hexdigest()}[algorithm]
    assert hash_file(p, algorithm) == (len(data), expected)


def test_hash_files_keeps_input_order_across_threads(tmp_path: Path) -> None:
    paths = []
    for i in range(9):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * (i * 100_000 + 1))
        paths.append(p)
    assert hash_files(paths, threads=4) == [hash_file(p) for p in paths]


@given(st.sets(st.integers(min_value=0, max_value=500), max_size=40), st.integers(min_value=0, max_value=6),
       st.integers(min_value=0, max_value=50))
def test_retention_keeps_newest_last_k_and_milestones(steps: set[int], keep_last: int, keep_every: int) -> None:
    doomed = steps_to_delete(steps, keep_last, keep_every)
    kept = steps - set(doomed)
    assert set(doomed) <= steps and doomed == sorted(doomed)
    if steps:
        assert max(steps) in kept  # the newest valid checkpoint always survives
    assert set(sorted(steps)[-max(1, keep_last):]) <= kept
    if keep_every:
        assert {s for s in steps if s % keep_every == 0} <= kept
    assert len(kept) <= max(1, keep_last) + len({s for s in steps if keep_every and s % keep_every == 0})


def test_a_file_truncated_while_hashed_never_crashes_the_verifier(tmp_path: Path) -> None:
    """Mapped hashing runs in worker processes: a truncation under a mapping (SIGBUS) kills a worker, and the
    files are hashed again with plain reads. The answer is the file as it was or as it is, never a crash."""
    import threading

    from supervisor.checkpoint.hashing import hash_file_mapped

    data = os.urandom(1 << 20) * 48
    for attempt in range(3):
        p = tmp_path / f"shard{attempt}"
        p.write_bytes(data)
        full = hash_file_mapped(p, "crc32")
        cutter = threading.Timer(0.005 * attempt, lambda p=p: os.truncate(p, 0))
        cutter.start()
        (result,) = hash_files([p], "crc32")
        cutter.join()
        assert result in (full, (0, "00000000"))

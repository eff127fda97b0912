"""File hashes for checkpoint manifests.

WHY crc32 by default: the manifest guards against torn writes, truncation and bit rot, not against an
attacker (who could rewrite the unsigned manifest too). zlib's crc32 detects every burst error up to 32
bits, misses random corruption with probability 2**-32, releases the GIL on large buffers (so threads
hash files in parallel) and was the fastest stdlib option measured here: crc32 4.1 GB/s, sha256
1.8 GB/s (SHA-NI), blake2b 0.8 GB/s, md5 0.75 GB/s per core (docs/checkpoints.md). sha256 and
blake2b stay available for users who want a cryptographic digest.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

DEFAULT_ALGORITHM = "crc32"
CHUNK_BYTES = 1 << 20


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: memoryview) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


_FACTORIES: dict[str, Callable[[], object]] = {
    "crc32": _Crc32,
    "sha256": hashlib.sha256,
    "blake2b": hashlib.blake2b,
}
ALGORITHMS = tuple(_FACTORIES)


def hash_file(path: str | os.PathLike[str], algorithm: str = DEFAULT_ALGORITHM) -> tuple[int, str]:
    """Return ``(bytes read, hex digest)`` of ``path``, streaming through one reused buffer."""
    try:
        hasher = _FACTORIES[algorithm]()
    except KeyError:
        raise ValueError(f"unknown hash algorithm {algorithm!r} (known: {', '.join(ALGORITHMS)})") from None
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    total = 0
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            hasher.update(view[:n])  # type: ignore[attr-defined]
            total += n
    return total, hasher.hexdigest()  # type: ignore[attr-defined]


def default_threads() -> int:
    """Enough threads to overlap I/O with hashing on every core, without flooding a shared filesystem."""
    return max(2, min(16, 2 * (os.cpu_count() or 1)))


def hash_files(
    paths: Sequence[str | os.PathLike[str]], algorithm: str = DEFAULT_ALGORITHM, threads: int | None = None
) -> list[tuple[int, str]]:
    """Hash many files in parallel threads; results are in the order of ``paths``.

    Largest files are started first so one big shard does not end up alone at the tail.
    """
    if not paths:
        return []
    workers = min(threads or default_threads(), len(paths))
    if workers <= 1:
        return [hash_file(p, algorithm) for p in paths]
    order = sorted(range(len(paths)), key=lambda i: _size_or_zero(paths[i]), reverse=True)
    results: list[tuple[int, str]] = [(0, "")] * len(paths)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ckpt-hash") as pool:
        futures = {i: pool.submit(hash_file, paths[i], algorithm) for i in order}
        for i, fut in futures.items():
            results[i] = fut.result()
    return results


def _size_or_zero(path: str | os.PathLike[str]) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return 0

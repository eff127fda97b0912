"""File hashes for checkpoint manifests.

WHY a CRC: the manifest guards against torn writes, truncation and bit rot, not against an attacker
(who could rewrite the unsigned manifest too). A 32-bit CRC detects every burst error up to 32 bits
and misses random corruption with probability 2**-32, and it is the fastest option, so full
verification runs near disk/page-cache speed. Measured here (docs/checkpoints.md): crc32c (the
``crc32c`` package, SSE4.2 hardware CRC) 7-8.5 GB/s per core, zlib crc32 1.4-4.1 GB/s, sha256 1.8 GB/s
(SHA-NI), blake2b 0.8 GB/s. crc32c is the default when its package is installed, else stdlib crc32;
sha256 and blake2b stay available for users who want a cryptographic digest.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from supervisor.checkpoint.untrusted import open_regular

try:  # optional: hardware CRC32C, 2-5x faster than zlib.crc32
    import crc32c as _crc32c
except ImportError:  # pragma: no cover - depends on the environment
    _crc32c = None  # type: ignore[assignment]

CHUNK_BYTES = 4 << 20  # large reads: fewer syscalls; measured no slower than 1 MiB


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: memoryview) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


class _Crc32c(_Crc32):
    def update(self, data: memoryview) -> None:
        self.value = _crc32c.crc32c(data, self.value, gil_release_mode=1)  # type: ignore[union-attr]


_FACTORIES: dict[str, Callable[[], object]] = {
    "crc32c": _Crc32c,
    "crc32": _Crc32,
    "sha256": hashlib.sha256,
    "blake2b": hashlib.blake2b,
}
ALGORITHMS = tuple(_FACTORIES)  # every name a manifest may carry
DEFAULT_ALGORITHM = "crc32c" if _crc32c is not None else "crc32"


def available(algorithm: str) -> bool:
    """Can this process compute ``algorithm``? (crc32c needs the optional ``crc32c`` package.)"""
    return algorithm in _FACTORIES and (algorithm != "crc32c" or _crc32c is not None)


def hash_file(path: str | os.PathLike[str], algorithm: str = DEFAULT_ALGORITHM) -> tuple[int, str]:
    """Return ``(bytes read, hex digest)`` of ``path``, streaming through one reused buffer."""
    if not available(algorithm):
        raise ValueError(f"hash algorithm {algorithm!r} is not available here (known: {', '.join(ALGORITHMS)}; "
                         "crc32c needs `pip install crc32c`)")
    hasher = _FACTORIES[algorithm]()
    buf = bytearray(CHUNK_BYTES)
    view = memoryview(buf)
    total = 0
    with os.fdopen(open_regular(path, None, follow=True), "rb", buffering=0) as f:  # never a FIFO or device
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


def hash_file_mapped(path: str | os.PathLike[str], algorithm: str = DEFAULT_ALGORITHM) -> tuple[int, str]:
    """Like :func:`hash_file`, through a read-only mapping: no copy out of the page cache, so a cached
    checkpoint verifies faster than ``cat`` can read it. A file truncated while mapped raises SIGBUS, which
    kills the process: call this only in a worker process (see :func:`hash_files`)."""
    with os.fdopen(open_regular(path, None, follow=True), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return hash_file(path, algorithm)
        hasher = _FACTORIES[algorithm]()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            if hasattr(mapped, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
                mapped.madvise(mmap.MADV_SEQUENTIAL)
            view = memoryview(mapped)
            try:
                for offset in range(0, size, CHUNK_BYTES):
                    hasher.update(view[offset:offset + CHUNK_BYTES])  # type: ignore[attr-defined]
            finally:
                view.release()
    return size, hasher.hexdigest()  # type: ignore[attr-defined]


def looks_cached(path: str | os.PathLike[str], probes: int = 8) -> bool:
    """Whether the file seems to be in the page cache: a few 1-byte reads that must not wait for the disk
    (``RWF_NOWAIT``) at spread offsets. Cached files hash faster mapped; cold ones faster with read()'s
    read-ahead."""
    flag = getattr(os, "RWF_NOWAIT", None)
    if flag is None:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        size = os.fstat(fd).st_size
        buf = bytearray(1)
        for i in range(probes):
            try:
                os.preadv(fd, [buf], (size - 1) * i // max(1, probes - 1), flag)
            except BlockingIOError:
                return False
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def _mapped_task(job: tuple[str, str]) -> tuple[int, str]:
    path, algorithm = job
    return hash_file_mapped(path, algorithm) if looks_cached(path) else hash_file(path, algorithm)


def hash_files(
    paths: Sequence[str | os.PathLike[str]], algorithm: str = DEFAULT_ALGORITHM, threads: int | None = None,
    isolated: bool = True,
) -> list[tuple[int, str]]:
    """Hash many files in parallel; results are in the order of ``paths``.

    With ``isolated`` (the default) the files are mapped and hashed in worker processes, so a file truncated
    under us can only kill a worker (SIGBUS): the pool breaks and every file is hashed again with plain reads in
    threads, which are always safe. Largest files are started first so one big shard does not end up alone at
    the tail.
    """
    if not paths:
        return []
    if not available(algorithm):
        raise ValueError(f"hash algorithm {algorithm!r} is not available here (known: {', '.join(ALGORITHMS)}; "
                         "crc32c needs `pip install crc32c`)")
    workers = min(threads or default_threads(), len(paths))
    order = sorted(range(len(paths)), key=lambda i: _size_or_zero(paths[i]), reverse=True)
    results: list[tuple[int, str]] = [(0, "")] * len(paths)
    if isolated:
        try:
            with ProcessPoolExecutor(max_workers=workers) as pool:
                jobs = [(os.fspath(paths[i]), algorithm) for i in order]
                for i, result in zip(order, pool.map(_mapped_task, jobs, chunksize=max(1, len(jobs) // 64)),
                                     strict=True):  # fmt: skip
                    results[i] = result
            return results
        except BrokenProcessPool:
            pass  # a worker died (a file changed under it): fall through to the safe path
    if workers <= 1:
        return [hash_file(p, algorithm) for p in paths]
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

"""Pure judgement of node readings: which problems make a node unfit to train, and what to do about them.

Why these signals: the Llama 3 interruption census is dominated by faulty GPUs and HBM (220 of 419); NVML exposes
the early signs that need no workload to show: uncorrectable ECC errors since boot, pending page retirements or
row remaps (a reset is needed), a failed row remap (the GPU should be replaced), hardware slowdown, heat.
"""

from __future__ import annotations

from dataclasses import dataclass

FATAL = "fatal"  # the node should not run training: exclude it (exit code 8)
WARN = "warn"  # worth an alert; training may go on


@dataclass(frozen=True)
class GpuReading:
    index: int
    name: str = ""
    uuid: str = ""
    ecc_uncorrectable_volatile: int | None = None  # None: not supported / ECC off
    retired_pages_pending: bool | None = None
    remap_pending: bool | None = None
    remap_failed: bool | None = None
    temperature_c: int | None = None
    hw_slowdown: bool | None = None
    error: str | None = None  # the GPU could not be queried at all (fell off the bus, driver error)


@dataclass(frozen=True)
class NodeReading:
    node: str
    shm_writable: bool
    shm_free_bytes: int
    nvml: str  # "ok", or why NVML is unavailable ("no NVIDIA driver", ...)
    gpus: tuple[GpuReading, ...] = ()
    expected_gpus: int | None = None  # from the allocation (e.g. SLURM_GPUS_ON_NODE), when known


@dataclass(frozen=True)
class Problem:
    severity: str
    what: str
    fix: str


@dataclass(frozen=True)
class Limits:
    min_shm_free_bytes: int = 64 << 20  # slots are 1 KiB per rank; stack dumps and DCP staging need more
    max_temperature_c: int = 90


def evaluate(reading: NodeReading, limits: Limits = Limits()) -> list[Problem]:
    problems: list[Problem] = []
    if not reading.shm_writable:
        problems.append(Problem(FATAL, "/dev/shm is not writable", "fix the node's /dev/shm mount (tmpfs, rw)"))
    elif reading.shm_free_bytes < limits.min_shm_free_bytes:
        problems.append(Problem(FATAL, f"/dev/shm has only {reading.shm_free_bytes >> 20} MiB free",
                                "clean stale files in /dev/shm or enlarge it"))  # fmt: skip
    if reading.expected_gpus is not None and len(reading.gpus) < reading.expected_gpus:
        problems.append(Problem(FATAL, f"{len(reading.gpus)} GPUs visible, the allocation has {reading.expected_gpus}",
                                "a GPU fell off the bus or the driver lost it: drain the node and reset it"))  # fmt: skip
    for gpu in reading.gpus:
        tag = f"GPU {gpu.index}" + (f" ({gpu.uuid})" if gpu.uuid else "")
        if gpu.error:
            problems.append(Problem(FATAL, f"{tag} cannot be queried: {gpu.error}", "drain the node and reset the GPU"))
            continue
        if gpu.ecc_uncorrectable_volatile:
            problems.append(Problem(FATAL, f"{tag} has {gpu.ecc_uncorrectable_volatile} uncorrectable ECC errors "
                                    "since the last reset", "drain the node; reset the GPU before reuse"))  # fmt: skip
        if gpu.remap_failed:
            problems.append(Problem(FATAL, f"{tag} failed a row remap", "drain the node and replace the GPU"))
        if gpu.remap_pending or gpu.retired_pages_pending:
            problems.append(Problem(FATAL, f"{tag} has a pending row remap / page retirement",
                                    "drain the node and reset the GPU to apply it"))  # fmt: skip
        if gpu.hw_slowdown:
            problems.append(Problem(WARN, f"{tag} is in hardware slowdown", "check cooling and power; expect a straggler"))
        if gpu.temperature_c is not None and gpu.temperature_c >= limits.max_temperature_c:
            problems.append(Problem(WARN, f"{tag} runs at {gpu.temperature_c} C", "check the node's cooling"))
    return problems


def fit(problems: list[Problem]) -> bool:
    return not any(p.severity == FATAL for p in problems)

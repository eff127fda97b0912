"""Pure judgement of node readings: which problems make a node unfit to train, and what to do about them.

Why these signals: the Llama 3 interruption census is dominated by faulty GPUs and HBM (220 of 419); NVML exposes
the early signs that need no workload to show: Xid events, uncorrectable ECC errors, pending page retirements or
row remaps (a reset is needed), a failed row remap (replace the GPU), lost GPUs, hardware slowdown, heat. On the
host, a full checkpoint or campaign filesystem (space or inodes) or /dev/shm makes the next checkpoint or the
heartbeat slots fail. Each problem names its check, the value read and the threshold, so a drain reason or an
alert says exactly what was measured (docs/health.md lists each check with its threshold and source).

Severity: FATAL problems make the node unfit (exit 8, drained in operator mode, blamed in a campaign); WARN
problems are reported only. Memory pressure and power/thermal throttling only warn: the training itself causes
them, and draining a node because its job is busy would be wrong.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.decisions import xid as xid_table
from supervisor.health import xid as xidmod

FATAL = "fatal"  # the node should not run training: exclude it (exit code 8)
WARN = "warn"  # worth an alert; training may go on

# NVML clock throttle reason bits (nvmlClocksThrottleReason*): the ones that mean "the hardware slows itself".
THROTTLE_BITS = {0x8: "hw_slowdown", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown"}  # fmt: skip


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
    ecc_uncorrectable_aggregate: int | None = None  # lifetime count
    retired_pages_dbe: int | None = None  # pages retired for double-bit errors (pre-A100 page retirement)
    throttle_reasons: int | None = None  # nvmlDeviceGetCurrentClocksThrottleReasons mask
    power_w: float | None = None
    power_limit_w: float | None = None
    pci_bus_id: str = ""
    xids: tuple[xidmod.XidEvent, ...] = ()  # seen through the NVML event API since the last reading


@dataclass(frozen=True)
class FsReading:
    path: str
    role: str  # "checkpoint", "campaign", ...
    free_bytes: int | None = None
    total_bytes: int | None = None
    free_inodes: int | None = None
    total_inodes: int | None = None
    error: str | None = None  # statvfs failed or did not answer in time


@dataclass(frozen=True)
class MemReading:
    total_bytes: int
    available_bytes: int
    psi_full_avg10: float | None = None  # /proc/pressure/memory "full avg10" (% of time all tasks stalled)


@dataclass(frozen=True)
class NodeReading:
    node: str
    shm_writable: bool
    shm_free_bytes: int
    nvml: str  # "ok", or why NVML is unavailable ("no NVIDIA GPU: ...")
    gpus: tuple[GpuReading, ...] = ()
    expected_gpus: int | None = None  # from the allocation (e.g. SLURM_GPUS_ON_NODE), when known
    filesystems: tuple[FsReading, ...] = ()
    memory: MemReading | None = None
    visible_devices: tuple[str, ...] | None = None  # CUDA_VISIBLE_DEVICES entries (indices or UUIDs), when set
    kernel_xids: tuple[xidmod.XidEvent, ...] = ()  # from the kernel log (/dev/kmsg), when readable
    clock_offset_s: float | None = None  # this node's wall clock minus the batch host's (None: not measured)


@dataclass(frozen=True)
class Problem:
    severity: str
    what: str
    fix: str
    check: str = ""  # short name: "fs_free", "xid", "ecc_uncorrectable", ...
    value: str = ""
    threshold: str = ""

    def reason(self) -> str:
        """The drain reason Slurm shows: ``supervise: <check> <value> (threshold <t>)``."""
        return f"supervise: {self.check} {self.value} (threshold {self.threshold})"


@dataclass(frozen=True)
class Limits:
    min_shm_free_bytes: int = 64 << 20  # slots are 1 KiB per rank; stack dumps and DCP staging need more
    max_temperature_c: int = 90
    fs_min_free_gib: float = 5.0  # a checkpoint must fit; below this the next save fails half-written
    fs_min_free_inodes: int = 10_000  # DCP writes a file per rank per checkpoint
    mem_min_available_fraction: float = 0.05  # warn only
    mem_max_psi_full_avg10: float = 20.0  # warn only
    xid_window_s: float = 3600.0  # kernel-log Xids older than this are history, not the node's state
    max_clock_offset_s: float = 1.0  # warn: timelines and step times across nodes stop lining up
    max_clock_offset_fatal_s: float = 30.0  # fatal: half the heartbeat channel's 60 s freshness window

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Limits:
        """From a config file's ``[health]`` table; unknown keys and bad numbers are ValueErrors."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, float | int] = {}
        for key, value in data.items():
            if key not in known:
                raise ValueError(f"health.{key}: unknown threshold; known: {', '.join(sorted(known))}")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"health.{key} must be a finite number >= 0, got {value!r}")
            values[key] = int(value) if isinstance(known[key].default, int) else float(value)
        return cls(**values)  # type: ignore[arg-type]

    def to_pairs(self) -> list[str]:
        """The thresholds that differ from the defaults, as ``KEY=VALUE`` (the agent's ``--health-limit``)."""
        default = Limits()
        return [f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self)
                if getattr(self, f.name) != getattr(default, f.name)]  # fmt: skip

    @classmethod
    def from_pairs(cls, pairs: Iterable[str]) -> Limits:
        """``["fs_min_free_gib=100", ...]`` (the CLI's ``--limit``); ValueError naming the key and the fix."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, float | int] = {}
        for pair in pairs:
            key, sep, text = pair.partition("=")
            if not sep or key not in known:
                raise ValueError(f"--limit {pair!r}: use KEY=VALUE with KEY one of {', '.join(sorted(known))}")
            try:
                number = float(text)
            except ValueError:
                raise ValueError(f"--limit {pair!r}: {text!r} is not a number") from None
            if not math.isfinite(number) or number < 0:
                raise ValueError(f"--limit {pair!r}: use a finite number >= 0")
            values[key] = int(number) if isinstance(known[key].default, int) else number
        return cls(**values)  # type: ignore[arg-type]


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f}GiB"


def evaluate(reading: NodeReading, limits: Limits = Limits()) -> list[Problem]:
    problems: list[Problem] = []
    problems += _shm(reading, limits)
    problems += _filesystems(reading.filesystems, limits)
    problems += _memory(reading.memory, limits)
    problems += _clock(reading.clock_offset_s, limits)
    problems += _gpus(reading, limits)
    return problems


def _shm(reading: NodeReading, limits: Limits) -> list[Problem]:
    if not reading.shm_writable:
        return [Problem(FATAL, "/dev/shm is not writable", "fix the node's /dev/shm mount (tmpfs, rw)",
                        "shm_writable", "no", "writable")]  # fmt: skip
    if reading.shm_free_bytes < limits.min_shm_free_bytes:
        return [Problem(FATAL, f"/dev/shm has only {reading.shm_free_bytes >> 20} MiB free",
                        "clean stale files in /dev/shm or enlarge it", "shm_free",
                        f"{reading.shm_free_bytes >> 20}MiB", f"{limits.min_shm_free_bytes >> 20}MiB")]  # fmt: skip
    return []


def _filesystems(filesystems: Iterable[FsReading], limits: Limits) -> list[Problem]:
    out: list[Problem] = []
    min_free = int(limits.fs_min_free_gib * (1 << 30))
    for fs in filesystems:
        where = f"the {fs.role} filesystem ({fs.path})"
        if fs.error:
            out.append(Problem(FATAL, f"{where} cannot be read: {fs.error}", "check the mount (a hung NFS?)",
                               f"fs_{fs.role}", "unreadable", "readable"))  # fmt: skip
            continue
        if fs.free_bytes is not None and fs.free_bytes < min_free:
            out.append(Problem(FATAL, f"{where} has {_gib(fs.free_bytes)} free", "free space there (old checkpoints "
                               "are kept by retention: see docs/checkpoints.md) or point the run elsewhere",
                               f"fs_free:{fs.path}", _gib(fs.free_bytes), _gib(min_free)))  # fmt: skip
        if fs.free_inodes is not None and fs.total_inodes and fs.free_inodes < limits.fs_min_free_inodes:
            out.append(Problem(FATAL, f"{where} has {fs.free_inodes} free inodes", "delete small files there",
                               f"fs_inodes:{fs.path}", str(fs.free_inodes), str(limits.fs_min_free_inodes)))  # fmt: skip
    return out


def _memory(mem: MemReading | None, limits: Limits) -> list[Problem]:
    if mem is None or mem.total_bytes <= 0:
        return []
    out: list[Problem] = []
    fraction = mem.available_bytes / mem.total_bytes
    if fraction < limits.mem_min_available_fraction:
        out.append(Problem(WARN, f"only {fraction:.1%} of memory is available", "expect the OOM killer: check what "
                           "else runs on the node", "mem_available", f"{fraction:.3f}",
                           f"{limits.mem_min_available_fraction:g}"))  # fmt: skip
    if mem.psi_full_avg10 is not None and mem.psi_full_avg10 >= limits.mem_max_psi_full_avg10:
        out.append(Problem(WARN, f"memory pressure: all tasks stalled {mem.psi_full_avg10:.1f}% of the last 10 s",
                           "the node is swapping or reclaiming: expect a straggler", "mem_psi_full",
                           f"{mem.psi_full_avg10:.1f}", f"{limits.mem_max_psi_full_avg10:g}"))  # fmt: skip
    return out


def _clock(offset: float | None, limits: Limits) -> list[Problem]:
    if offset is None or not math.isfinite(offset) or abs(offset) <= limits.max_clock_offset_s:
        return []
    fatal = abs(offset) > limits.max_clock_offset_fatal_s
    return [Problem(FATAL if fatal else WARN, f"the clock is {offset:+.1f} s off the batch host's",
                    "fix time sync on the node (chrony/ntpd)" + ("; its heartbeat frames are near the channel's "
                    "freshness window and will be refused as stale" if fatal else ""), "clock_offset",
                    f"{offset:+.1f}s", f"{limits.max_clock_offset_fatal_s if fatal else limits.max_clock_offset_s:g}s")]  # fmt: skip


def _missing_visible(reading: NodeReading) -> list[str]:
    if reading.visible_devices is None or reading.nvml != "ok":
        return []
    uuids = {g.uuid for g in reading.gpus}
    missing = []
    for dev in reading.visible_devices:
        dev = dev.strip()
        if dev.isdigit():
            if int(dev) >= len(reading.gpus):
                missing.append(dev)
        elif dev and not any(u.startswith(dev) for u in uuids if u):  # CUDA accepts UUID prefixes
            missing.append(dev)
    return missing


def _gpus(reading: NodeReading, limits: Limits) -> list[Problem]:
    out: list[Problem] = []
    if reading.expected_gpus is not None and len(reading.gpus) < reading.expected_gpus:
        out.append(Problem(FATAL, f"{len(reading.gpus)} GPUs visible, the allocation has {reading.expected_gpus}",
                           "a GPU fell off the bus or the driver lost it: drain the node and reset it",
                           "gpus_visible", str(len(reading.gpus)), str(reading.expected_gpus)))  # fmt: skip
    missing = _missing_visible(reading)
    if missing:
        out.append(Problem(FATAL, f"CUDA_VISIBLE_DEVICES names GPUs NVML does not see: {', '.join(missing)}",
                           "a GPU fell off the bus or the driver lost it: drain the node and reset it",
                           "gpus_missing", ",".join(missing), "none"))  # fmt: skip
    for gpu in reading.gpus:
        out += _gpu(gpu, limits)
    for event in reading.kernel_xids:
        if event.age_s is None or event.age_s <= limits.xid_window_s:
            out.append(_xid_problem(event, f"GPU {event.gpu}"))
    return out


def _xid_problem(event: xidmod.XidEvent, tag: str) -> Problem:
    kind = xid_table.kind_of(event.code)
    what = f"{tag} reported Xid {event.code}: {xid_table.meaning_of(event.code)}"
    if kind == xid_table.HARDWARE:
        return Problem(FATAL, what, "drain the node; reset the GPU (replace it if it repeats)", "xid", str(event.code),
                       "hardware Xid")  # fmt: skip
    if kind == xid_table.APPLICATION:
        return Problem(WARN, what, "usually the application's bug: read its log", "xid", str(event.code),
                       "application Xid")  # fmt: skip
    return Problem(WARN, what, "look it up in NVIDIA's Xid table", "xid", str(event.code), "unknown Xid")


def _gpu(gpu: GpuReading, limits: Limits) -> list[Problem]:
    tag = f"GPU {gpu.index}" + (f" ({gpu.uuid})" if gpu.uuid else "")
    if gpu.error:
        return [Problem(FATAL, f"{tag} cannot be queried: {gpu.error}", "drain the node and reset the GPU",
                        f"gpu{gpu.index}_query", "error", "answers")]  # fmt: skip
    out: list[Problem] = [_xid_problem(e, tag) for e in gpu.xids]
    if gpu.ecc_uncorrectable_volatile:
        out.append(Problem(FATAL, f"{tag} has {gpu.ecc_uncorrectable_volatile} uncorrectable ECC errors since the "
                           "last reset", "drain the node; reset the GPU before reuse", f"gpu{gpu.index}_ecc_uncorrectable",
                           str(gpu.ecc_uncorrectable_volatile), "0"))  # fmt: skip
    if gpu.remap_failed:
        out.append(Problem(FATAL, f"{tag} failed a row remap", "drain the node and replace the GPU",
                           f"gpu{gpu.index}_remap_failed", "yes", "no"))  # fmt: skip
    if gpu.remap_pending or gpu.retired_pages_pending:
        out.append(Problem(FATAL, f"{tag} has a pending row remap / page retirement",
                           "drain the node and reset the GPU to apply it", f"gpu{gpu.index}_remap_pending", "yes",
                           "no"))  # fmt: skip
    if gpu.retired_pages_dbe:
        out.append(Problem(WARN, f"{tag} has {gpu.retired_pages_dbe} pages retired for double-bit ECC errors",
                           "watch it: a growing count means the memory is failing", f"gpu{gpu.index}_retired_pages",
                           str(gpu.retired_pages_dbe), "0"))  # fmt: skip
    slow = [name for bit, name in THROTTLE_BITS.items() if gpu.throttle_reasons and gpu.throttle_reasons & bit]
    if gpu.hw_slowdown and "hw_slowdown" not in slow:
        slow.insert(0, "hw_slowdown")
    if slow:
        out.append(Problem(WARN, f"{tag} is throttled ({', '.join(slow)})", "check cooling and power; expect a "
                           "straggler", f"gpu{gpu.index}_throttle", "+".join(slow), "none"))  # fmt: skip
    if gpu.temperature_c is not None and gpu.temperature_c >= limits.max_temperature_c:
        out.append(Problem(WARN, f"{tag} runs at {gpu.temperature_c} C", "check the node's cooling",
                           f"gpu{gpu.index}_temperature", f"{gpu.temperature_c}C", f"{limits.max_temperature_c}C"))  # fmt: skip
    if gpu.power_w is not None and gpu.power_limit_w and gpu.power_w > gpu.power_limit_w * 1.05:
        out.append(Problem(WARN, f"{tag} draws {gpu.power_w:.0f} W over its {gpu.power_limit_w:.0f} W limit",
                           "check the power supply and the limit (nvidia-smi -q -d POWER)", f"gpu{gpu.index}_power",
                           f"{gpu.power_w:.0f}W", f"{gpu.power_limit_w:.0f}W"))  # fmt: skip
    return out


def fit(problems: list[Problem]) -> bool:
    return not any(p.severity == FATAL for p in problems)

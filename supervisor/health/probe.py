"""Take a node's readings: /dev/shm, and every GPU through NVML (nvidia-ml-py) when a driver is present."""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any

from supervisor.health.checks import GpuReading, NodeReading


def _shm() -> tuple[bool, int]:
    try:
        st = os.statvfs("/dev/shm")
        with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="supervise-health-"):
            pass
        return True, st.f_bavail * st.f_frsize
    except OSError:
        return False, 0


def _call(fn: Any, *args: Any) -> Any:
    """An NVML query, or None when this GPU or driver does not support it."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses per code; unsupported is not a fault
        return None


def _gpu(nvml: Any, index: int) -> GpuReading:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as err:  # noqa: BLE001
        return GpuReading(index, error=str(err))
    name = _call(nvml.nvmlDeviceGetName, handle)
    uuid = _call(nvml.nvmlDeviceGetUUID, handle)
    ecc = _call(nvml.nvmlDeviceGetTotalEccErrors, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC)  # fmt: skip
    remap = _call(nvml.nvmlDeviceGetRemappedRows, handle)  # (corr, unc, pending, failed)
    pending_pages = _call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    temp = _call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
    reasons = _call(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    slowdown_mask = getattr(nvml, "nvmlClocksThrottleReasonHwSlowdown", 0x8)
    return GpuReading(
        index=index,
        name=name.decode() if isinstance(name, bytes) else (name or ""),
        uuid=uuid.decode() if isinstance(uuid, bytes) else (uuid or ""),
        ecc_uncorrectable_volatile=ecc,
        retired_pages_pending=None if pending_pages is None else bool(pending_pages),
        remap_pending=None if remap is None else bool(remap[2]),
        remap_failed=None if remap is None else bool(remap[3]),
        temperature_c=temp,
        hw_slowdown=None if reasons is None else bool(reasons & slowdown_mask),
    )


def read_node(expected_gpus: int | None = None) -> NodeReading:
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    writable, free = _shm()
    try:
        import pynvml as nvml  # from nvidia-ml-py

        nvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - no driver on CPU nodes: GPU checks are skipped, not failed
        return NodeReading(node, writable, free, f"NVML unavailable ({err.__class__.__name__}: {err})",
                           expected_gpus=expected_gpus)  # fmt: skip
    try:
        count = nvml.nvmlDeviceGetCount()
        gpus = tuple(_gpu(nvml, i) for i in range(count))
    finally:
        _call(nvml.nvmlShutdown)
    return NodeReading(node, writable, free, "ok", gpus, expected_gpus)

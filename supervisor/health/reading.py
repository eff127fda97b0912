"""Take a node's readings: /dev/shm, filesystems, memory (psutil), every GPU through NVML (nvidia-ml-py) and Xid
events (the NVML event API while watching, the kernel log for a one-shot check).

Nothing here judges; ``checks`` does. A host without an NVIDIA driver reads as ``nvml = "no NVIDIA GPU (...)"``,
never as an exception; any single query the GPU or driver does not support reads as None ("unknown").
Every reading that could hang (a dead NFS mount, a GPU that no longer answers) runs under a deadline.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from supervisor.health import xid as xidmod
from supervisor.health.checks import FsReading, GpuReading, MemReading, NodeReading

T = TypeVar("T")


def with_deadline(fn: Callable[[], T], timeout_s: float, what: str) -> T:
    """``fn()`` in a daemon thread; TimeoutError naming ``what`` when it does not return within ``timeout_s``."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name=f"health-{what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not answer within {timeout_s:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def node_name(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _shm() -> tuple[bool, int]:
    try:
        st = os.statvfs("/dev/shm")
        with tempfile.NamedTemporaryFile(dir="/dev/shm", prefix="supervise-health-"):
            pass
        return True, st.f_bavail * st.f_frsize
    except OSError:
        return False, 0


def _statvfs_nearest(path: str) -> os.statvfs_result:
    """statvfs of ``path`` or, when it does not exist yet (a checkpoint directory before the first save), of its
    nearest existing parent: the filesystem it will be created on."""
    current = os.path.abspath(path)
    while True:
        try:
            return os.statvfs(current)
        except FileNotFoundError:
            parent = os.path.dirname(current)
            if parent == current:
                raise
            current = parent


def read_fs(path: str, role: str, timeout_s: float = 5.0, nearest_existing: bool = False) -> FsReading:
    stat = _statvfs_nearest if nearest_existing else os.statvfs
    try:
        st = with_deadline(lambda: stat(path), timeout_s, f"statvfs {path}")
    except (OSError, TimeoutError) as err:
        return FsReading(path, role, error=str(err))
    return FsReading(path, role, st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize, st.f_favail, st.f_files)


def read_memory() -> MemReading | None:
    try:
        import psutil

        vm = psutil.virtual_memory()
    except Exception:  # noqa: BLE001 - no reading is "unknown", never an alarm
        return None
    psi = None
    try:
        with open("/proc/pressure/memory") as fh:
            for line in fh:
                if line.startswith("full"):
                    psi = float(line.split("avg10=")[1].split()[0])
    except (OSError, IndexError, ValueError):
        pass
    return MemReading(int(vm.total), int(vm.available), psi)


def read_kernel_xids(limit_bytes: int = 4 << 20) -> tuple[xidmod.XidEvent, ...]:
    """Xid lines from /dev/kmsg (readable by root; others get nothing, which is "unknown", not "healthy")."""
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return ()
    records: list[str] = []
    total = 0
    try:
        while total < limit_bytes:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError:  # EPIPE: a record was overwritten while reading; go on
                continue
            if not chunk:
                break
            total += len(chunk)
            records.append(chunk.decode(errors="replace"))
    finally:
        os.close(fd)
    try:
        with open("/proc/uptime") as fh:
            uptime = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return ()
    return tuple(xidmod.parse_kmsg(records, uptime))


def _call(fn: Any, *args: Any) -> Any:
    """An NVML query, or None when this GPU or driver does not support it."""
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - pynvml raises NVMLError subclasses per code; unsupported is not a fault
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else (value or "")


def _gpu(nvml: Any, index: int, xids: tuple[xidmod.XidEvent, ...] = ()) -> GpuReading:
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as err:  # noqa: BLE001
        return GpuReading(index, error=str(err))
    ecc = _call(nvml.nvmlDeviceGetTotalEccErrors, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                nvml.NVML_VOLATILE_ECC)  # fmt: skip
    ecc_all = _call(nvml.nvmlDeviceGetTotalEccErrors, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    nvml.NVML_AGGREGATE_ECC)  # fmt: skip
    remap = _call(nvml.nvmlDeviceGetRemappedRows, handle)  # (corr, unc, pending, failed)
    pending_pages = _call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
    retired = _call(nvml.nvmlDeviceGetRetiredPages, handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    temp = _call(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU)
    reasons = _call(nvml.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
    power = _call(nvml.nvmlDeviceGetPowerUsage, handle)  # mW
    limit = _call(nvml.nvmlDeviceGetEnforcedPowerLimit, handle)  # mW
    pci = _call(nvml.nvmlDeviceGetPciInfo, handle)
    slowdown_mask = getattr(nvml, "nvmlClocksThrottleReasonHwSlowdown", 0x8)
    uuid = _text(_call(nvml.nvmlDeviceGetUUID, handle))
    return GpuReading(
        index=index,
        name=_text(_call(nvml.nvmlDeviceGetName, handle)),
        uuid=uuid,
        ecc_uncorrectable_volatile=ecc,
        retired_pages_pending=None if pending_pages is None else bool(pending_pages),
        remap_pending=None if remap is None else bool(remap[2]),
        remap_failed=None if remap is None else bool(remap[3]),
        temperature_c=temp,
        hw_slowdown=None if reasons is None else bool(reasons & slowdown_mask),
        ecc_uncorrectable_aggregate=ecc_all,
        retired_pages_dbe=None if retired is None else len(retired),
        throttle_reasons=reasons,
        power_w=None if power is None else power / 1000.0,
        power_limit_w=None if limit is None else limit / 1000.0,
        pci_bus_id=_text(getattr(pci, "busId", "")) if pci is not None else "",
        xids=tuple(x for x in xids if x.gpu in (str(index), uuid)),
    )


def open_nvml() -> tuple[Any | None, str]:
    """(the pynvml module, initialised) or (None, why not): never raises for a missing driver."""
    try:
        import pynvml  # from nvidia-ml-py

        pynvml.nvmlInit()
    except Exception as err:  # noqa: BLE001 - no driver on CPU nodes: a clear reading, not a failure
        return None, f"no NVIDIA GPU (NVML unavailable: {err.__class__.__name__}: {err})"
    return pynvml, "ok"


def read_gpus(nvml: Any, xids: tuple[xidmod.XidEvent, ...] = ()) -> tuple[GpuReading, ...]:
    count = nvml.nvmlDeviceGetCount()
    return tuple(_gpu(nvml, i, xids) for i in range(count))


def visible_devices(env: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    env = os.environ if env is None else env
    text = env.get("CUDA_VISIBLE_DEVICES")
    if text is None or text.strip() in ("", "NoDevFiles"):
        return None
    return tuple(d.strip() for d in text.split(",") if d.strip())


def read_node(
    expected_gpus: int | None = None,
    filesystems: Mapping[str, str] | None = None,
    *,
    node: str | None = None,
    kernel_log: bool = True,
    timeout_s: float = 20.0,
    nvml_xids: tuple[xidmod.XidEvent, ...] = (),
    nvml: Any = None,
    nearest_existing: bool = False,
) -> NodeReading:
    """One full reading. ``filesystems``: role -> path (e.g. {"checkpoint": "/scratch/ckpt"}). ``nvml``: an
    already initialised pynvml (the agent keeps one open); else NVML is opened and shut down here."""
    name = node or node_name()
    writable, free = _shm()
    fs = tuple(read_fs(path, role, min(5.0, timeout_s), nearest_existing)
               for role, path in (filesystems or {}).items())
    memory = read_memory()
    kernel = read_kernel_xids() if kernel_log else ()
    base = dict(node=name, shm_writable=writable, shm_free_bytes=free, expected_gpus=expected_gpus,
                filesystems=fs, memory=memory, visible_devices=visible_devices(), kernel_xids=kernel)  # fmt: skip
    own = nvml is None
    if own:
        nvml, status = open_nvml()
        if nvml is None:
            return NodeReading(nvml=status, **base)  # type: ignore[arg-type]
    try:
        gpus = with_deadline(lambda: read_gpus(nvml, nvml_xids), timeout_s, "NVML")
    except TimeoutError as err:
        return NodeReading(nvml="ok", gpus=(GpuReading(-1, error=str(err)),), **base)  # type: ignore[arg-type]
    except Exception as err:  # noqa: BLE001 - a driver failure after init: every GPU is unknown
        return NodeReading(nvml="ok", gpus=(GpuReading(-1, error=f"NVML failed: {err}"),), **base)  # type: ignore[arg-type]
    finally:
        if own:
            _call(nvml.nvmlShutdown)
    return NodeReading(nvml="ok", gpus=gpus, **base)  # type: ignore[arg-type]


class XidWatcher:
    """Xid events through the NVML event API (``nvmlEventTypeXidCriticalError``): registered once, drained at
    each check with a zero wait. Events before registration are not seen (the kernel log covers those)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.event_set = None
        self.problem = ""
        self._index: dict[Any, str] = {}
        try:
            self.event_set = nvml.nvmlEventSetCreate()
            for i in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(i)
                self._index[_handle_key(handle)] = str(i)
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, self.event_set)
        except Exception as err:  # noqa: BLE001 - unsupported (e.g. some vGPUs): said in the reading
            self.problem = f"Xid events unavailable: {err}"

    def drain(self, max_events: int = 1000) -> tuple[xidmod.XidEvent, ...]:
        if self.event_set is None:
            return ()
        out = []
        for _ in range(max_events):
            try:
                data = self.nvml.nvmlEventSetWait_v2(self.event_set, 0)
            except Exception:  # noqa: BLE001 - NVMLError_Timeout: no more events
                break
            gpu = self._index.get(_handle_key(data.device), "?")
            out.append(xidmod.XidEvent(int(data.eventData), gpu, None, "NVML Xid event"))
        return tuple(out)

    def close(self) -> None:
        if self.event_set is not None:
            _call(self.nvml.nvmlEventSetFree, self.event_set)
            self.event_set = None


def _handle_key(handle: Any) -> Any:
    try:
        import ctypes

        return ctypes.cast(handle, ctypes.c_void_p).value
    except Exception:  # noqa: BLE001
        return id(handle)

"""A stand-in for pynvml that answers from recorded values: the tests' seam for the GPU path (never in the wheel).

The product knows nothing of it: ``nvml_shadow/pynvml.py`` is a module named ``pynvml`` that the tests put first
on the import path (``PYTHONPATH`` for the node agents on the local cluster, ``sys.modules`` in unit tests), so
``import pynvml`` in ``supervisor/health/reading.py`` gets it and the real probe code (``probe._gpu``,
``XidWatcher``) runs on NVML-shaped answers: integration tests feed a node agent a GPU fault on a machine without
GPUs, and a reading taken on a GPU machine can be replayed. ``SUPERVISOR_HEALTH_RECORDED=FILE`` (a JSON file
every node can read) maps a node name (``SLURMD_NODENAME``; or ``"*"``: every other node) to::

    {"init_error": "Driver Not Loaded",          # optional: nvmlInit raises this (the no-GPU path)
     "gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-…", "pci_bus_id": "00000000:3B:00.0",
               "ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0,
               "remapped_rows": [correctable, uncorrectable, pending, failed],
               "retired_pages_pending": 0, "retired_pages_dbe": [page addresses],
               "temperature_c": 41, "throttle_reasons": 0, "power_mw": 71000, "power_limit_mw": 700000,
               "lost": false}],                  # lost: the handle query fails (fell off the bus)
     "xids": [{"gpu": 0, "code": 79, "after_s": 8}]}  # delivered once through the NVML event API (after_s:
                                                  # not before that many seconds after NVML was opened)

A key left out answers as pynvml does for an unsupported query (an ``NVMLError``), which the probe reads as
unknown. Values are the raw NVML units (milliwatts, the throttle-reason bit mask).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ENV = "SUPERVISOR_HEALTH_RECORDED"


class NVMLError(Exception):
    """What pynvml's NVMLError is to the probe: a query that did not answer."""


@dataclass(frozen=True)
class _Handle:
    index: int


@dataclass(frozen=True)
class _Pci:
    busId: str  # noqa: N815 - pynvml's field name


@dataclass(frozen=True)
class _EventData:
    device: _Handle
    eventData: int  # noqa: N815 - pynvml's field name
    eventType: int = 8  # noqa: N815


class RecordedNvml:
    """The subset of pynvml the probe calls, answering from one node's recorded document."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_AGGREGATE_ECC = 1
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_TEMPERATURE_GPU = 0
    nvmlClocksThrottleReasonHwSlowdown = 0x8  # noqa: N815
    nvmlEventTypeXidCriticalError = 0x8  # noqa: N815

    def __init__(self, doc: Mapping[str, Any]) -> None:
        self.doc = doc
        gpus = doc.get("gpus", [])
        self.gpus: list[Mapping[str, Any]] = [g for g in gpus if isinstance(g, Mapping)] if isinstance(gpus, list) else []
        xids = doc.get("xids", [])
        self.pending_xids = [x for x in xids if isinstance(x, Mapping)] if isinstance(xids, list) else []
        self.registered: set[int] = set()
        self.created = time.monotonic()
        self.handles = [_Handle(i) for i in range(len(self.gpus))]  # one object per GPU, as NVML's are stable

    # --- library
    def nvmlInit(self) -> None:  # noqa: N802 - pynvml's names
        if self.doc.get("init_error"):
            raise NVMLError(str(self.doc["init_error"]))

    def nvmlShutdown(self) -> None:  # noqa: N802
        return None

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:  # noqa: N802
        if not 0 <= index < len(self.gpus):
            raise NVMLError("Invalid Argument")
        if self.gpus[index].get("lost"):
            raise NVMLError("GPU is lost")
        return self.handles[index]

    def _value(self, handle: _Handle, key: str) -> Any:
        value = self.gpus[handle.index].get(key)
        if value is None:
            raise NVMLError("Not Supported")
        return value

    # --- device queries (the probe's)
    def nvmlDeviceGetName(self, handle: _Handle) -> str:  # noqa: N802
        return str(self._value(handle, "name"))

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:  # noqa: N802
        return str(self._value(handle, "uuid"))

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _Pci:  # noqa: N802
        return _Pci(str(self._value(handle, "pci_bus_id")))

    def nvmlDeviceGetTotalEccErrors(self, handle: _Handle, error_type: int, counter: int) -> int:  # noqa: N802
        if error_type != self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            raise NVMLError("Not Supported")
        key = "ecc_uncorrected_volatile" if counter == self.NVML_VOLATILE_ECC else "ecc_uncorrected_aggregate"
        return int(self._value(handle, key))

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:  # noqa: N802
        rows = self._value(handle, "remapped_rows")
        corr, unc, pending, failed = (int(x) for x in rows)
        return corr, unc, pending, failed

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:  # noqa: N802
        return int(self._value(handle, "retired_pages_pending"))

    def nvmlDeviceGetRetiredPages(self, handle: _Handle, cause: int) -> list[int]:  # noqa: N802
        return [int(x) for x in self._value(handle, "retired_pages_dbe")]

    def nvmlDeviceGetTemperature(self, handle: _Handle, sensor: int) -> int:  # noqa: N802
        return int(self._value(handle, "temperature_c"))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: _Handle) -> int:  # noqa: N802
        return int(self._value(handle, "throttle_reasons"))

    def nvmlDeviceGetPowerUsage(self, handle: _Handle) -> int:  # noqa: N802
        return int(self._value(handle, "power_mw"))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: _Handle) -> int:  # noqa: N802
        return int(self._value(handle, "power_limit_mw"))

    # --- the event API (Xid events)
    def nvmlEventSetCreate(self) -> object:  # noqa: N802
        return self

    def nvmlDeviceRegisterEvents(self, handle: _Handle, types: int, event_set: object) -> None:  # noqa: N802
        self.registered.add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: object, timeout_ms: int) -> _EventData:  # noqa: N802
        elapsed = time.monotonic() - self.created
        for x in list(self.pending_xids):
            after = x.get("after_s", 0)
            if isinstance(after, (int, float)) and after > elapsed:
                continue  # not happened yet
            self.pending_xids.remove(x)
            gpu = x.get("gpu", 0)
            if isinstance(gpu, int) and gpu in self.registered and isinstance(x.get("code"), int):
                return _EventData(self.handles[gpu], int(x["code"]))
        raise NVMLError("Timeout")

    def nvmlEventSetFree(self, event_set: object) -> None:  # noqa: N802
        return None


def document_for(node: str, env: Mapping[str, str] | None = None) -> Mapping[str, Any] | None:
    """This node's recorded document when ``SUPERVISOR_HEALTH_RECORDED`` names one (else None: no GPU).
    An unreadable file is an error (a test seam must not silently read the real hardware instead)."""
    env = os.environ if env is None else env
    path = env.get(ENV)
    if not path:
        return None
    with open(path) as fh:
        doc = json.load(fh)
    if not isinstance(doc, Mapping):
        raise ValueError(f"{ENV}={path}: not a JSON object of node -> reading")
    entry = doc.get(node, doc.get("*"))
    return entry if isinstance(entry, Mapping) else None

"""``pynvml`` as the tests see it: answers from the recorded readings of ``recorded_nvml.py``.

Put this directory first on the import path (``PYTHONPATH=tests/harness/nvml_shadow``; the node agents of the local
cluster inherit it through sbatch and srun) and ``import pynvml`` in the product gets this module. Each
``nvmlInit`` reads ``SUPERVISOR_HEALTH_RECORDED`` for this node (``SLURMD_NODENAME``, else the host name): a node
the file does not name has no GPU ("Driver Not Loaded"), and an unreadable file is said at ``nvmlInit``, never
answered by the real hardware instead.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/harness: recorded_nvml

from recorded_nvml import NVMLError, RecordedNvml, document_for  # noqa: E402

NVML_MEMORY_ERROR_TYPE_UNCORRECTED = RecordedNvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
NVML_VOLATILE_ECC = RecordedNvml.NVML_VOLATILE_ECC
NVML_AGGREGATE_ECC = RecordedNvml.NVML_AGGREGATE_ECC
NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = RecordedNvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR
NVML_TEMPERATURE_GPU = RecordedNvml.NVML_TEMPERATURE_GPU
nvmlClocksThrottleReasonHwSlowdown = RecordedNvml.nvmlClocksThrottleReasonHwSlowdown  # noqa: N816
nvmlEventTypeXidCriticalError = RecordedNvml.nvmlEventTypeXidCriticalError  # noqa: N816

_current: RecordedNvml | None = None


def nvmlInit() -> None:  # noqa: N802 - pynvml's name
    global _current
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        doc = document_for(node)
    except (OSError, ValueError) as err:
        raise NVMLError(f"recorded readings unreadable: {err}") from None
    if doc is None:
        raise NVMLError("Driver Not Loaded")
    recorded = RecordedNvml(doc)
    recorded.nvmlInit()
    _current = recorded


def __getattr__(name: str) -> Any:
    """Every other pynvml call answers from this node's reading, once ``nvmlInit`` found one."""
    if name.startswith("nvml") and _current is not None:
        return getattr(_current, name)
    raise AttributeError(name)

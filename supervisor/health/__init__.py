"""Node health: readings taken by ``probe`` (NVML, Xid events, filesystems, memory, /dev/shm), judged by the
pure ``checks``; ``drain`` is operator mode (HealthCheckProgram), ``agent`` the node agent's periodic entry."""

from __future__ import annotations

from typing import Any


def agent_checks(*args: Any, **kwargs: Any) -> Any:
    """See :func:`supervisor.health.periodic.agent_checks` (imported lazily: NVML and psutil load on first use)."""
    from supervisor.health.periodic import agent_checks as run

    return run(*args, **kwargs)

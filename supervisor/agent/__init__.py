"""The node agent: one per node, started as an overlapping srun step (``python -m supervisor.agent``).

WHY a separate per-node process: it outlives training-step restarts, watches rank processes that never
call the client (pid liveness, stopped/zombie state, CPU progress), samples the shared-memory slots of
those that do, and sends one compact authenticated summary per node to the supervisor, so the batch host
never opens 16k connections or polls 131k processes.  Stdlib + psutil only: no torch.
"""

from __future__ import annotations

"""Plain, version-independent records of what Slurm says about jobs and nodes.

Parsers for every Slurm output shape (22.05 and 24.11 JSON, ``scontrol -o`` text, sacct) produce these, so the
classifier and policy never see a Slurm version difference.
"""

from __future__ import annotations

from dataclasses import dataclass

JOB_BASE_STATES = frozenset(
    {
        "PENDING", "RUNNING", "SUSPENDED", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
        "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY",
    }
)  # fmt: skip
JOB_TERMINAL_STATES = frozenset(JOB_BASE_STATES - {"PENDING", "RUNNING", "SUSPENDED"})

JOB_FLAG_PRIORITY = (
    "COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
    "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING",
)  # fmt: skip
"""Job state flags in the order Slurm's ``job_state_string`` prefers them over the base state (text output)."""

HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state"})

NODE_BASE_STATES = frozenset({"IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN"})


@dataclass(frozen=True)
class JobInfo:
    """One job as slurmctld sees it now. Times are epoch seconds, None when Slurm has no value."""

    job_id: str
    """``123``, or ``123_4`` for an array task, ``123+1`` for a het component."""
    state: str
    """What ``squeue -o %T`` prints: a state flag like COMPLETING when set, else the base state."""
    base_state: str | None = None
    """PENDING, RUNNING, CANCELLED... (None when only a flag is known, as in 22.05's COMPLETING)."""
    flags: frozenset[str] = frozenset()
    name: str | None = None
    reason: str | None = None
    """Why it is pending or ended (``BeginTime``, ``launch_failed_requeued_held``); None for Slurm's "None"."""
    restart_count: int = 0
    nodes: tuple[str, ...] = ()
    batch_host: str | None = None
    excluded_nodes: tuple[str, ...] = ()
    partition: str | None = None
    submit_time: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    """For a running job: when its time limit expires."""
    preempt_time: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    requeue: bool | None = None
    """Whether Slurm may requeue the job (``--requeue`` / JobRequeue=1)."""
    time_limit_min: int | None = None
    """None: unlimited or unknown."""
    priority: int | None = None
    """0 means held (user or admin hold, requeue-hold)."""
    source: str = ""
    """Which output this came from (``squeue-json``, ``scontrol``), for evidence."""
    raw_job_id: str = ""
    """Slurm's unique numeric id (what SLURM_JOB_ID holds in an array task); equals ``job_id`` otherwise."""

    @property
    def is_pending(self) -> bool:
        return self.base_state == "PENDING" and "COMPLETING" not in self.flags

    @property
    def is_running(self) -> bool:
        return self.base_state == "RUNNING" and "COMPLETING" not in self.flags

    @property
    def is_completing(self) -> bool:
        return "COMPLETING" in self.flags

    @property
    def is_finished(self) -> bool:
        """Ended and fully cleaned up: nothing more will happen unless someone requeues it."""
        return self.base_state in JOB_TERMINAL_STATES and not self.is_completing

    @property
    def is_held(self) -> bool:
        """Pending and will not start until released (user/admin hold, requeue-hold, special exit)."""
        if self.flags & {"REQUEUE_HOLD", "SPECIAL_EXIT"}:
            return True
        if self.base_state != "PENDING":
            return False
        return self.priority == 0 or (self.reason or "") in HELD_REASONS


@dataclass(frozen=True)
class NodeInfo:
    """One node: base state plus flags (DRAIN, NOT_RESPONDING, COMPLETING, ...)."""

    name: str
    state: str
    """IDLE, ALLOCATED, MIXED, DOWN, ERROR, FUTURE or UNKNOWN."""
    flags: frozenset[str] = frozenset()
    reason: str | None = None
    reason_user: str | None = None
    reason_time: int | None = None
    partitions: tuple[str, ...] = ()
    source: str = ""

    @property
    def is_down(self) -> bool:
        return self.state == "DOWN" or "NOT_RESPONDING" in self.flags or "FAIL" in self.flags

    @property
    def is_drain(self) -> bool:
        """Drained or draining: the scheduler will not place new work on it."""
        return "DRAIN" in self.flags

    @property
    def is_usable(self) -> bool:
        """Could run new work now."""
        return self.state in {"IDLE", "ALLOCATED", "MIXED"} and not (
            self.is_down or self.is_drain or self.flags & {"MAINTENANCE", "REBOOT_REQUESTED", "POWERED_DOWN"}
        )


@dataclass(frozen=True)
class JobRun:
    """One run of a job from accounting (``sacct --duplicates``): each requeue adds one."""

    job_id: str
    state: str
    reason: str | None = None
    nodes: tuple[str, ...] = ()
    submit_time: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    exit_code: int | None = None
    exit_signal: int | None = None
    restart_count: int | None = None

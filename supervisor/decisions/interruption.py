"""The vocabulary of an ending: what was seen (:class:`Evidence`, :class:`RankExit`), what each piece of it says
(:class:`Finding`) and what was concluded (:class:`Interruption`). Pure records; ``classify`` turns the first into
the last, the driver fills the evidence (``driver/evidence.py``), the policy and the journal read the conclusion.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from supervisor.decisions import events as ev
from supervisor.decisions.detect.findings import DetectionEvent
from supervisor.decisions.tasklog import LogLine

if TYPE_CHECKING:
    from slurm.model import JobInfo, NodeInfo

# Who saw a finding. A node drained for the whole site (operator mode) needs a witness other than the program's
# own output, which is untrusted (docs/security.md): a rank's printed Xid excludes its node from this campaign only.
SLURM, AGENT, PROGRAM = "slurm", "agent", "program"
WITNESSES = (SLURM, AGENT, PROGRAM)


@dataclass(frozen=True)
class RankExit:
    """How one rank process ended. ``exit_code`` as the shell reports it (128+N for signal N) or ``signal``."""

    node: str
    rank: int | None = None
    exit_code: int | None = None
    signal: int | None = None
    t: float | None = None

    def signal_number(self) -> int | None:
        if self.signal:
            return self.signal
        if self.exit_code is not None and self.exit_code < 0:
            return -self.exit_code  # Python's returncode convention
        if self.exit_code is not None and 128 < self.exit_code < 160:
            return self.exit_code - 128
        return None


@dataclass(frozen=True)
class Evidence:
    """Everything known when the step stopped (or when a detection asks whether to stop it). All optional.

    Missing is *unknown*, never "nothing wrong": ``job_state=None`` means Slurm's view of the job could not be
    read (the interruption's confidence is lowered and says so); a node absent from ``node_states`` has an
    unknown state, and an empty ``allocation_nodes`` means the step's nodes are unknown: no node is blamed on
    an agent's silence alone without both."""

    job_state: str | None = None  # the *job's* Slurm state: RUNNING, PREEMPTED, TIMEOUT, NODE_FAIL, CANCELLED, ...
    job_reason: str | None = None
    end_time: float | None = None  # the job's EndTime (time limit), unix seconds
    preempt_time: float | None = None
    batch_signals: tuple[tuple[str, float], ...] = ()  # (signal name "USR1"/"TERM", unix time) seen by the batch step
    signal_lead_s: float = 60.0  # T of --signal=B:USR1@T
    time_limit_near: float | None = None  # when the supervisor's own clock found that USR1 was overdue
    sigterm_ranks: tuple[int, ...] = ()  # ranks whose client saw SIGTERM
    # Ranks whose client saw the program end normally (atexit ran with no unhandled exception: the client's
    # RANK_FLAG_ENDED_CLEAN): a crash of theirs in the interpreter's teardown is not a failure (classify).
    ended_clean_ranks: tuple[int, ...] = ()
    rank_exits: tuple[RankExit, ...] = ()
    node_states: Mapping[str, str] = field(default_factory=dict)  # allocation node -> Slurm state ("DOWN*", ...)
    detections: tuple[tuple[float, DetectionEvent], ...] = ()  # (time, detection)
    log_lines: tuple[LogLine, ...] = ()
    gpu_faults: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # node -> problems found
    supervisor_killed: bool = False  # the supervisor stopped the step itself: SIGTERM/SIGKILL exits are ours
    allocation_nodes: tuple[str, ...] = ()  # the step's nodes (tells "every agent silent" from "one node gone")
    # The job's EndTime when this run started (its time limit); None: no time limit, or unknown. Only a TERM at
    # or after it is a time limit (scancel moves ``end_time`` to the moment of the cancel).
    scheduled_end: float | None = None
    task_nodes: tuple[str, ...] = ()  # node of each task id of the step (tasklog.task_nodes): attributes log lines
    # node -> its address (NodeAddr) or host name, so a comm error naming a peer by address blames that node;
    # an address several nodes share (one host running several slurmd) or a loopback address names nobody.
    node_addresses: Mapping[str, str] = field(default_factory=dict)
    # Nodes where each earlier app_error of the campaign happened (Interruption.origin_nodes), oldest first:
    # an app error blames a node only when it repeats there and nowhere else (History.app_error_origins).
    app_error_history: tuple[tuple[str, ...], ...] = ()
    # The ranks each of those app errors came from (Interruption.origin_ranks; () unknown), aligned with
    # app_error_history: a crash that kept to one node *and* one rank may follow the rank, not the node.
    app_error_rank_history: tuple[tuple[int, ...], ...] = ()
    # Added with the driver's one Evidence per ending (the loop fills every field below):
    job_nodes: tuple[str, ...] = ()  # every node of the job's allocation, spares included
    slurm_job: JobInfo | None = None  # typed Slurm job record (job_state/job_reason above are derived from it)
    slurm_nodes: Mapping[str, NodeInfo] = field(default_factory=dict)  # typed Slurm state per allocation node
    unknown: tuple[str, ...] = ()  # sources whose query failed ("slurm_job", "slurm_nodes"): unknown, not empty
    last_steps: Mapping[int, int] = field(default_factory=dict)  # rank -> last iteration it reported
    # The node agents' fatal health findings behind ``gpu_faults``, detection-shaped (kind, metric, value,
    # threshold, nodes): the interruption's alert carries their figures (driver/health_watch.py).
    health_findings: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Finding:
    cls: str  # an interruption class, or "killed"
    confidence: float
    text: str
    nodes: tuple[str, ...] = ()  # nodes this finding blames
    group: str | None = None  # "node/rank" the finding belongs to, for consequence analysis
    t: float | None = None
    # A hardware suspect: an error a failing GPU *can* cause but the program usually does (an illegal address, a
    # SIGBUS). It keeps its class unless the same node's health check or a repeat after the ranks moved
    # corroborates it (``_corroborated``, ``classify``).
    suspect: bool = False
    source: str = ""  # who saw it: one of WITNESSES ("" for the supervisor's own reckoning)
    signature: str = ""  # the log signature that matched, for a log line

    @property
    def where(self) -> str | None:
        """The node the finding was observed on (not necessarily blamed), if known."""
        node = self.group.split("/")[0] if self.group else None
        return node if node and node != "None" else None


@dataclass(frozen=True)
class Interruption:
    cls: str
    blamed_nodes: tuple[str, ...]
    confidence: float
    evidence: tuple[str, ...]
    origin_nodes: tuple[str, ...] = ()  # where the winning evidence was observed, blamed or not
    origin_ranks: tuple[int, ...] = ()  # the ranks it came from, when known
    witnesses: tuple[str, ...] = ()  # who saw the evidence that blames the nodes (WITNESSES)

    @property
    def beyond_the_program(self) -> bool:
        """Whether someone other than the program's own output witnessed the blame (Slurm, a node agent): what a
        site-wide action (draining a node) needs."""
        return any(w != PROGRAM for w in self.witnesses)

    def to_event(self, t: float) -> ev.Event:
        event = ev.interruption_event(t, self.cls, self.blamed_nodes, self.confidence, self.evidence)
        if self.witnesses:
            event["witnesses"] = list(self.witnesses)
        if self.origin_nodes:
            event["origin_nodes"] = sorted(self.origin_nodes)
        if self.origin_ranks:
            event["origin_ranks"] = sorted(self.origin_ranks)
        return event

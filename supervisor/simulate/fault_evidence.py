"""What each kind of fault looks like to the supervisor: synthetic :class:`classify.Evidence`. Pure.

This is the simulator's one adapter to the decision core: a fault (kind, node, crash or hang) becomes the
evidence the supervisor loop would hold when the step stops (log lines with the node they came from, rank exits,
detections, Slurm node states, GPU health), and the real ``classify.classify`` names the class and the nodes to
blame. If the classifier cannot blame the right node, the simulation pays for it (the bad node comes back).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from supervisor.decisions.classify import Evidence, LogLine, RankExit
from supervisor.decisions.detect.findings import NODE_SILENT, NONFINITE_LOSS, RANK_HANG, DetectionEvent

CRASH, HANG = "crash", "hang"


@dataclass(frozen=True)
class Symptom:
    """How a kind of fault shows itself, and what it leaves behind."""

    logs: tuple[str, ...] = ()  # lines the failing node's ranks (or its kernel log) print
    exit_signal: int | None = None  # how the failing rank dies when it crashes (None: exit code below)
    exit_code: int | None = None
    gpu_fault: str | None = None  # what a GPU health probe on the node reports afterwards
    node_down: bool = False  # Slurm marks the node DOWN / NOT_RESPONDING (even plain Slurm stops using it)
    agent_silent: bool = False  # the node drops off the network: its agent goes silent
    nonfinite_loss: bool = False
    always_hangs: bool = False  # never a crash: the ranks stop making progress
    never_hangs: bool = False
    node_at_fault: bool = True  # a broken node that may fail again if it is used again


SYMPTOMS: Mapping[str, Symptom] = MappingProxyType({
    "gpu": Symptom(("NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.",), exit_signal=6),
    "hbm3": Symptom(("CUDA error: uncorrectable ECC error encountered",), exit_signal=6,
                    gpu_fault="DBE (double bit error) in HBM3: retired pages pending"),
    "sram": Symptom(("NVRM: Xid (PCI:0000:9b:00): 95, uncontained ECC error in SRAM",), exit_signal=6),
    "gsp": Symptom(("NVRM: Xid (PCI:0000:3b:00): 119, Timeout after 6s of waiting for RPC response from GSP",),
                   always_hangs=True),
    "thermal": Symptom((), exit_signal=6, gpu_fault="GPU thermal violation: clocks held at minimum"),
    "nic": Symptom(("NCCL WARN NET/IB : Got completion from peer with error 12, opcode 0, len 0",),
                   agent_silent=True, never_hangs=True),
    "host_maintenance": Symptom((), node_down=True, never_hangs=True, node_at_fault=False),
    "network": Symptom(("NCCL WARN NET/IB : Got completion from peer with error 12, opcode 0, len 0",
                        "ncclRemoteError: A call failed possibly due to a network error or a remote process "
                        "exiting prematurely."), exit_code=1, node_at_fault=False),
    "nccl_watchdog": Symptom(("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1, OpType=ALLREDUCE)",),
                             always_hangs=True, node_at_fault=False),
    "software": Symptom(("Traceback (most recent call last):", "RuntimeError: shape mismatch in the data loader"),
                        exit_code=1, node_at_fault=False),
    "sdc": Symptom((), nonfinite_loss=True, never_hangs=True, node_at_fault=True),
    "unknown": Symptom((), exit_signal=9, node_at_fault=False),
})  # fmt: skip


def manifestation(kind: str, draw: float, hang_fraction: float) -> str:
    """``hang`` or ``crash`` for one fault, ``draw`` uniform in [0, 1)."""
    s = SYMPTOMS[kind]
    if s.always_hangs:
        return HANG
    if s.never_hangs:
        return CRASH
    return HANG if draw < hang_fraction else CRASH


def evidence(kind: str, node: str, how: str, t: float, allocation: tuple[str, ...]) -> Evidence:
    """The evidence the supervisor holds when it stops the step for this fault (at time ``t``)."""
    s = SYMPTOMS[kind]
    logs = tuple(LogLine(text, node, 0) for text in s.logs)
    exits: tuple[RankExit, ...] = ()
    detections: list[tuple[float, DetectionEvent]] = []
    if how == HANG:
        detections.append((t, DetectionEvent(RANK_HANG, (0,), (node,), "silence_s", 60.0, 30.0, 60.0,
                                             (f"rank 0 on {node} made no progress for 60 s",))))  # fmt: skip
    elif s.exit_signal is not None or s.exit_code is not None:
        exits = (RankExit(node, 0, s.exit_code, s.exit_signal, t),)
    if s.agent_silent:
        detections.append((t, DetectionEvent(NODE_SILENT, (), (node,), "silence_s", 10.0, 10.0, 10.0,
                                             (f"no summary from {node}'s agent for 10 s",))))  # fmt: skip
    if s.nonfinite_loss:
        detections.append((t, DetectionEvent(NONFINITE_LOSS, (0,), (node,), "loss", float("nan"), None, None,
                                             ("loss is nan at step 1000",))))  # fmt: skip
    return Evidence(
        job_state="RUNNING",
        rank_exits=exits,
        node_states={node: "DOWN*"} if s.node_down else {},
        detections=tuple(detections),
        log_lines=logs,
        gpu_faults={node: (s.gpu_fault,)} if s.gpu_fault else {},
        supervisor_killed=how == HANG,  # the supervisor kills a hung step itself
        allocation_nodes=allocation,
    )

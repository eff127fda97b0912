"""The campaign simulation: one failure trace, played against a recovery strategy, every second accounted. Pure.

The job alternates between running and down. While it runs, it computes for ``interval`` seconds and then stalls
``stall_s`` for a checkpoint, which becomes valid (committed) ``write_s`` later (an asynchronous write; 0 for a
synchronous one, whose whole cost is the stall). A fault ends the run: the work since the newest *committed*
checkpoint is lost, then the job is down for detection, the response (back-off, requeue wait, preflight, restart)
and, when the policy stops the campaign, an operator's look. Faults that arrive while the job is down hit it as
soon as it is back up (their cost is a second restart, as in Daly's model). A node broken by a hardware fault
fails again (after an exponential time of use) if the strategy keeps using it.

The supervised strategy decides with the project's real code: ``classify.classify`` on the evidence a fault
leaves (evidence.py), ``policy.decide`` with the campaign's ``History`` and an ``Allocation``, the suspect-node
``Ledger``, and ``checkpoint_interval.advise`` for the interval. The buckets are the ledger's (docs/goodput.md)
and add up to the wall clock.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

from supervisor.decisions import checkpoint_interval as ci
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.decisions import warm_restart as warm_rule
from supervisor.decisions.classify import classify
from supervisor.decisions.ledger import Ledger, LedgerConfig
from supervisor.simulate import fault_evidence as sim_evidence
from supervisor.simulate.sim_journal import SimJournal
from supervisor.simulate.trace import Fault, node_name

BUCKETS = ("productive", "lost_work", "checkpoint", "detection", "restart", "queue", "preflight", "operator")


@dataclass(frozen=True)
class World:
    """The campaign and how faults behave (shared by every strategy, so they see the same faults)."""

    gpus: int = 16_384
    gpus_per_node: int = 8
    days: float = 54.0
    seed: int = 1
    hang_fraction: float = 0.2  # faults that stop progress without killing a process (besides GSP, NCCL watchdog)
    # A fault of a hardware kind (evidence.Symptom.node_at_fault: a faulty GPU, HBM, SRAM, GSP, NIC, thermal
    # part, an SDC) leaves its node broken with this probability (issue 13's naive baseline: "no exclusion, so a
    # bad node recurs"; Llama 3 counts root-caused faulty components, which stay faulty until replaced or reset) ...
    bad_node_p: float = 1.0
    recur_mean_s: float = 4 * 3600.0  # ... and a broken node in use fails again after this long on average
    site_drain_after: int = 3  # until a person or the site's health checks take it out, after this many faults

    @property
    def nodes(self) -> int:
        return max(1, math.ceil(self.gpus / self.gpus_per_node))

    @property
    def horizon_s(self) -> float:
        return self.days * 86400.0


@dataclass(frozen=True)
class Strategy:
    name: str
    supervised: bool  # True: classify/policy/ledger decide; False: plain Slurm requeue of every failure
    stall_s: float  # training blocked per checkpoint
    write_s: float  # from the end of the stall until the checkpoint is committed (async write)
    interval_s: float | None  # compute between checkpoints; None: "auto" (Young/Daly from checkpoint_interval)
    restart_s: float  # launch to first resumed step (process start, communicator init, restore)
    queue_s: float  # a requeued job's wait for its new allocation
    detect_crash_s: float  # a rank died -> the failure is known
    detect_hang_s: float  # progress stopped -> the failure is known
    detect_node_s: float  # a node died -> the failure is known
    preflight_s: float = 0.0  # node health check before each launch (0: none)
    preflight_catch: float = 0.8  # chance a preflight finds a broken node before the launch
    spares: int = 0  # extra nodes in the allocation to relaunch without requeueing
    operator_s: float = 3600.0  # the policy stopped or held the campaign: until a person resubmits it
    # The memory tier (docs/checkpoints.md): None: off; else each snapshot blocks the training this long, at the
    # cadence Young's formula gives for it against the faults it survives (relaunches in the allocation: a rank's
    # or a node's loss, its buddy holding the copy; a hang; a NaN's roll back). Those lose only the work since the
    # newest snapshot; a requeue or a stop after a fault (not a NaN) first flushes the newest snapshot to the
    # filesystem (``memory_flush_s``, the lost node's shards from its buddy) and loses only as much. The filesystem
    # interval is computed from the faults that end the job (a flush can fail: they still count).
    memory_stall_s: float | None = None
    memory_flush_s: float = 10.0  # the copy before the job lets go of its nodes (the driver's bound: 10 s)
    # With the memory tier: the agents persist the newest snapshot to the filesystem every this many seconds while
    # the job runs (``[run] memory_persist``; None: off), off the training's path. A requeue or stop after a run
    # that had one persisted (committed ``write_s`` after it started) leaves the filesystem interval's MTBF: had
    # its flush failed, the persisted copy was there (``checkpoint_interval.IntervalInputs``, as the driver).
    memory_persist_s: float | None = None
    # Warm restart (docs/launch.md): None: off (every relaunch costs ``restart_s``); else a relaunch in the
    # allocation that ``decisions.warm_restart`` would carry out in the ranks' processes (not a roll back, no node
    # left out, a hang only when it names its rank) costs this instead: the survivors keep their processes, CUDA
    # contexts and imports, a standby takes the dead rank; left is the communicators' re-creation and the state load.
    warm_restart_s: float | None = None
    policy_config: policy.PolicyConfig = field(default_factory=policy.PolicyConfig)
    ledger_config: LedgerConfig = field(default_factory=LedgerConfig)


def naive(stall_s: float = 30.0, interval_s: float = 3600.0, restart_s: float = 300.0, queue_s: float = 120.0,
          hang_timeout_s: float = 1800.0) -> Strategy:  # fmt: skip
    """Plain ``sbatch --requeue``: hourly synchronous checkpoints, hangs seen at the collective timeout, nodes
    left out only when Slurm itself marks them down."""
    return Strategy("naive Slurm requeue", False, stall_s, 0.0, interval_s, restart_s, queue_s,
                    detect_crash_s=30.0, detect_hang_s=hang_timeout_s, detect_node_s=300.0)  # fmt: skip


def supervised(stall_s: float = 1.0, write_s: float = 30.0, interval_s: float | None = None, restart_s: float = 60.0,
               queue_s: float = 120.0, detect_hang_s: float = 3.3, detect_crash_s: float = 1.2,
               detect_node_s: float = 10.0, preflight_s: float = 0.0, spares: int = 16) -> Strategy:  # fmt: skip
    """This supervisor with the figures bench/ measures (README's benchmark table; see docs/goodput.md)."""
    return Strategy("this supervisor", True, stall_s, write_s, interval_s, restart_s, queue_s, detect_crash_s,
                    detect_hang_s, detect_node_s, preflight_s, spares=spares)  # fmt: skip


@dataclass
class Outcome:
    strategy: str
    wall_s: float
    buckets: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    badput_by_class: dict[str, float] = field(default_factory=dict)  # interruption class -> seconds it cost
    interruptions: dict[str, int] = field(default_factory=dict)  # class -> count (trace kind for naive)
    recurrences: int = 0  # faults of broken nodes that were used again
    requeues: int = 0
    relaunches: int = 0  # restarts inside the allocation
    warm_restarts: int = 0  # of those, carried out in the ranks' processes (warm_restart_s)
    stops: int = 0  # the policy stopped/held the campaign and a person resubmitted it
    checkpoints: int = 0
    intervals: list[float] = field(default_factory=list)

    @property
    def goodput(self) -> float:
        return self.buckets["productive"] / self.wall_s if self.wall_s > 0 else 0.0

    def to_dict(self) -> dict[str, object]:
        return {
            "strategy": self.strategy, "goodput": round(self.goodput, 5), "wall_s": self.wall_s,
            "buckets_s": {k: round(v, 3) for k, v in self.buckets.items()},
            "badput_by_class_s": {k: round(v, 3) for k, v in sorted(self.badput_by_class.items())},
            "interruptions": dict(sorted(self.interruptions.items())), "recurrences": self.recurrences,
            "requeues": self.requeues, "relaunches": self.relaunches, "warm_restarts": self.warm_restarts,
            "stops": self.stops,
            "checkpoints": self.checkpoints,
            "mean_interval_s": round(sum(self.intervals) / len(self.intervals), 2) if self.intervals else None,
        }  # fmt: skip


@dataclass(frozen=True)
class Segment:
    """One run of ``length_s`` seconds split into kept work, lost work and checkpoint stall."""

    kept_s: float
    lost_s: float
    stall_s: float
    committed: int


def segment(length_s: float, interval_s: float, stall_s: float, write_s: float, final: bool = False) -> Segment:
    """Compute ``interval_s``, stall ``stall_s``, repeat; a checkpoint counts once committed (``write_s`` after its
    stall). ``final``: the run reached the end of the horizon, and its work is all kept."""
    period = interval_s + stall_s
    full = int(length_s // period)
    rest = length_s - full * period
    stall = full * stall_s + max(0.0, rest - interval_s)
    compute = length_s - stall
    if final:
        return Segment(compute, 0.0, stall, full)
    committed = int((length_s - write_s) // period) if length_s >= write_s + period else 0
    kept = min(compute, committed * interval_s)
    return Segment(kept, compute - kept, stall, committed)


class _Campaign:
    """Mutable state of one simulated campaign (kept private: the public surface is :func:`simulate`)."""

    def __init__(self, world: World, strategy: Strategy, recorder: SimJournal | None = None) -> None:
        self.world, self.s, self.rec = world, strategy, recorder
        self.step = 0  # the step of the newest committed checkpoint (one step per second of compute)
        self.out = Outcome(strategy.name, world.horizon_s)
        self.t = 0.0
        self.needed = world.nodes
        self.alloc = [node_name(i) for i in range(self.needed + strategy.spares)]
        self.fresh = len(self.alloc)
        self.alloc_set, self.alloc_tuple = set(self.alloc), tuple(self.alloc)
        self.running = self.alloc[: self.needed]
        self.off = set(self.alloc[self.needed :])  # the allocation's nodes not running (few: spares, left out)
        self.broken: dict[str, str] = {}  # node -> kind of the fault that broke it
        self.faults_on: dict[str, int] = {}  # node -> faults seen on it (the site drains repeat offenders)
        self.history = policy.History()
        self.ledger = Ledger(strategy.ledger_config)
        self.restarts_here = 0
        self.committed = 0
        self.fault_times: list[float] = []  # faults that lose the work since the filesystem checkpoint
        self.kept_in_memory: list[float] = []  # faults the memory tier recovers from (relaunches in place)
        self.in_place = False  # the newest fault was answered by a relaunch in the allocation
        self.flushed = False  # ... or by a requeue or stop after the newest snapshot was flushed to the filesystem
        # The newest restore point, in seconds of kept compute (one step per second): a committed checkpoint or
        # the memory snapshot a relaunch resumed from; a newer one is progress for the crash-loop budgets
        # (policy.History.progress), as the driver folds checkpoint_committed and memory_pick events.
        self.restore_point = 0.0

    def spend(self, bucket: str, seconds: float, cls: str | None = None) -> float:
        """Advance the clock through ``seconds`` of ``bucket`` (never past the horizon); returns what was spent."""
        seconds = max(0.0, min(seconds, self.world.horizon_s - self.t))
        self.out.buckets[bucket] += seconds
        if cls is not None:
            self.out.badput_by_class[cls] = self.out.badput_by_class.get(cls, 0.0) + seconds
        self.t += seconds
        return seconds

    def memory_interval(self) -> float:
        """Seconds of compute between memory snapshots: Young's interval for the snapshot's stall against the
        faults the tier recovers from (the site prior until three were seen), at least a second."""
        assert self.s.memory_stall_s is not None
        mtbf = ci.observed_mtbf_s(self.kept_in_memory, self.t) or ci.site_prior_mtbf_s(self.needed)
        return max(1.0, ci.young_interval(self.s.memory_stall_s, mtbf))

    def interval(self) -> float:
        if self.s.interval_s is not None:
            return self.s.interval_s
        advice = ci.advise("auto", delta_s=self.s.stall_s, restart_s=self.s.restart_s, nodes=self.needed,
                           interruption_times=self.fault_times, observed_s=self.t)  # fmt: skip
        assert advice.interval_s is not None
        return max(advice.interval_s, self.s.write_s)  # one write in flight at a time

    def is_running(self, node: str) -> bool:
        return node in self.alloc_set and node not in self.off

    def set_running(self, nodes: Sequence[str], left_out: Sequence[str] | None = None) -> None:
        """Run on the first ``needed`` of ``nodes`` (the allocation's in order); ``left_out``: the allocation's nodes
        not in ``nodes``, when the caller knows them (a 16k-node set rebuilt on every fault made a 131,072-GPU
        simulation slow)."""
        running = list(nodes[: self.needed])
        if running == self.running:
            return
        self.running = running
        if left_out is None:
            self.off = self.alloc_set.difference(running)
        else:
            self.off = set(left_out).union(nodes[self.needed :])

    def new_allocation(self, exclude: Sequence[str]) -> None:
        """A requeue: Slurm gives back the same nodes minus the excluded ones, topped up with others."""
        gone = set(exclude).intersection(self.alloc) if exclude else set()
        keep = [n for n in self.alloc if n not in gone] if gone else list(self.alloc)
        while len(keep) < self.needed + self.s.spares:
            keep.append(node_name(self.fresh))
            self.fresh += 1
        if keep != self.alloc:
            self.alloc, self.alloc_set, self.alloc_tuple = keep, set(keep), tuple(keep)
            self.running = []  # the set below recomputes which nodes are off
        self.set_running(keep, left_out=())
        self.restarts_here = 0
        self.out.requeues += 1

    def launch(self, cls: str | None, warm: bool = False) -> None:
        """Preflight (may find broken nodes and swap them for healthy spares), then the restart (``warm``: in the
        ranks' processes, no preflight: the launch's step goes on)."""
        if warm:
            assert self.s.warm_restart_s is not None
            t_launch = self.t
            self.spend("restart", self.s.warm_restart_s, cls)
            self.out.warm_restarts += 1
            if self.rec is not None:
                self.rec.launched(t_launch, self.t, self.running, self.step)
            return
        if self.s.preflight_s > 0:
            self.spend("preflight", self.s.preflight_s, cls)
            rng = random.Random(zlib.crc32(f"{self.world.seed}:{self.t}".encode()))
            found = [n for n in self.running if n in self.broken and rng.random() < self.s.preflight_catch]
            for node in found:
                self.ledger.strike(node, self.ledger.config.weights["hardware"], self.t, "preflight")
            if found:
                excluded = self.ledger.excluded_nodes(self.t)
                spares = iter([n for n in self.alloc if n in self.off and n not in excluded])
                self.set_running([next(spares, n) if n in found else n for n in self.running])
            if self.rec is not None:
                self.rec.preflight(self.t, self.s.preflight_s)
        t_launch = self.t
        self.spend("restart", self.s.restart_s, cls)
        if self.rec is not None:
            self.rec.launched(t_launch, self.t, self.running, self.step)

    def requeue(self, exclude: Sequence[str], cls: str, blamed: Sequence[str], last_step: int) -> None:
        """The Slurm run ends, the queue wait, a new allocation starts."""
        if self.rec is not None:
            self.rec.requeued(self.t, cls, blamed, last_step)
        self.new_allocation(exclude)
        self.spend("queue", self.s.queue_s, cls)
        if self.rec is not None:
            self.rec.allocated(self.t, self.alloc)

    def flush(self, cls: str) -> None:
        """With the memory tier, the newest snapshot is copied to the filesystem before the job ends (not after a
        NaN: policy._keep_memory); the next job resumes from it."""
        if self.s.memory_stall_s is None or cls == ev.NUMERICAL:
            return
        self.spend("restart", self.s.memory_flush_s, cls)
        self.flushed = True

    def place(self, fault: Fault) -> str:
        """The trace's node if the job runs there, else the running node it stands for."""
        if self.is_running(fault.node):
            return fault.node
        return self.running[zlib.crc32(fault.node.encode()) % len(self.running)]

    # -- the response to one fault ---------------------------------------------------------------------------

    def respond(self, fault: Fault, node: str, how: str, last_step: int) -> str:
        """Detection, decision and recovery for one fault; returns the class it was accounted under."""
        symptom = sim_evidence.SYMPTOMS[fault.kind]
        detect = self.s.detect_hang_s if how == sim_evidence.HANG else (
            self.s.detect_node_s if symptom.node_down or symptom.agent_silent else self.s.detect_crash_s)
        t_fault = self.t
        if not self.s.supervised:
            cls = fault.kind
            self.spend("detection", detect, cls)
            if self.rec is not None:
                self.rec.interrupted(self.t, detect, how == sim_evidence.HANG, "unknown", (), (fault.kind,), last_step,
                                     node)  # fmt: skip
            exclude = [node] if symptom.node_down or symptom.agent_silent else []  # Slurm's own word only
            self.requeue(exclude, "unknown", (), last_step)
            self.launch(cls)
            return cls
        spent = self.spend("detection", detect, None)  # charged to the class once it is known
        evidence = sim_evidence.evidence(fault.kind, node, how, t_fault, tuple(self.running))
        interruption = classify(evidence)
        cls = interruption.cls
        if self.rec is not None:
            self.rec.interrupted(self.t, detect, how == sim_evidence.HANG, cls, interruption.blamed_nodes,
                                 interruption.evidence[:2], last_step, node)  # fmt: skip
        self.out.badput_by_class[cls] = self.out.badput_by_class.get(cls, 0.0) + spent
        if self.restore_point > 0:
            self.history = self.history.progress(round(self.restore_point))
        allocation = policy.Allocation(
            nodes=self.alloc_tuple, needed=self.needed, excluded=self.ledger.excluded_nodes(self.t),
            step_running=how == sim_evidence.HANG, restarts_here=self.restarts_here,
        )  # fmt: skip
        decision = policy.decide(interruption, self.history, allocation, self.s.policy_config, now=self.t)
        self.history = self.history.record(cls, self.t)
        self.ledger.apply(interruption.to_event(self.t))
        actions = {a.kind: a for a in decision.actions}
        if policy.BACKOFF in actions:
            self.spend("restart", float(actions[policy.BACKOFF].params["seconds"]), cls)
        if policy.STOP in actions or policy.HOLD in actions:
            # A person reads the report, runs the site's diagnostics on the node it happened on (which finds
            # it if it is broken) and resubmits: the budgets start over, the ledger stays.
            self.out.stops += 1
            self.spend("operator", self.s.operator_s, cls)
            self.history = policy.History(best_step=self.history.best_step)
            self.flush(cls)
            found = [node] if self.broken.pop(node, None) else []
            self.requeue(sorted(self.ledger.excluded_nodes(self.t)) + found, cls, interruption.blamed_nodes, last_step)
        elif policy.RESTART_IN_ALLOCATION in actions:
            params = actions[policy.RESTART_IN_ALLOCATION].params
            before = self.running
            self.set_running(params["nodes"], left_out=params["exclude"])
            self.restarts_here += 1
            self.out.relaunches += 1
            self.in_place = True
            if self.s.warm_restart_s is not None and warm_rule.applies(decision, cls, before) and \
                    warm_rule.hung_ranks(cls, (d for _, d in evidence.detections)) is not None:  # fmt: skip
                self.launch(cls, warm=True)
                return cls
        else:  # REQUEUE / AWAIT_REQUEUE
            chosen = actions.get(policy.REQUEUE) or actions.get(policy.AWAIT_REQUEUE)
            exclude = list(chosen.params.get("exclude", [])) if chosen else []
            if chosen is not None and chosen.kind == policy.REQUEUE:
                self.flush(cls)
            self.requeue(exclude, cls, interruption.blamed_nodes, last_step)
        self.launch(cls)
        return cls


def simulate(world: World, strategy: Strategy, faults: Sequence[Fault], recorder: SimJournal | None = None) -> Outcome:
    """Play ``faults`` (sorted by time) against ``strategy`` over ``world.horizon_s``; ``recorder`` gets the
    campaign's journal events (record.py)."""
    c = _Campaign(world, strategy, recorder)
    horizon = world.horizon_s
    if recorder is not None:
        recorder.started(f"simulated {strategy.name}", c.alloc)
    c.launch(None)  # the first launch costs a start-up like any other
    i = 0
    while c.t < horizon:
        up = c.t
        interval = c.interval()
        c.out.intervals.append(interval)
        # a broken node in use fails again after an exponential time (memoryless: drawn afresh each run); the
        # first of k such nodes fails after an exponential time of k times the rate, each equally likely to be it
        rng = random.Random(zlib.crc32(f"{world.seed}:recur:{up}".encode()))
        t_recur, recur_node = math.inf, ""
        live = sorted((c.broken.keys() & c.alloc_set) - c.off)
        if live:
            t_recur = up + rng.expovariate(len(live) / world.recur_mean_s)
            recur_node = live[rng.randrange(len(live))]
        t_trace = max(faults[i].t, up) if i < len(faults) else math.inf
        t_end = min(t_trace, t_recur, horizon)
        seg = segment(t_end - up, interval, strategy.stall_s, strategy.write_s, final=t_end >= horizon)
        snapshot_every = c.memory_interval() if strategy.memory_stall_s is not None else None
        if snapshot_every is not None and strategy.memory_stall_s:  # the snapshots' copies out of the compute
            share = strategy.memory_stall_s / (snapshot_every + strategy.memory_stall_s)
            seg = Segment(seg.kept_s * (1 - share), seg.lost_s * (1 - share),
                          seg.stall_s + (seg.kept_s + seg.lost_s) * share, seg.committed)  # fmt: skip
        c.out.buckets["productive"] += seg.kept_s
        c.out.buckets["checkpoint"] += seg.stall_s
        c.out.checkpoints += seg.committed
        c.committed += seg.committed
        if seg.committed:
            c.restore_point = c.out.buckets["productive"]
        last_step = c.step + round(seg.kept_s + seg.lost_s)
        if recorder is not None:
            recorder.run(up, t_end, interval, strategy.stall_s, strategy.write_s, c.step, last_step, t_end >= horizon)
        c.step += round(seg.committed * interval) if t_end < horizon else round(seg.kept_s)
        c.t = t_end
        if t_end >= horizon:
            break
        if t_trace <= t_recur:
            fault, draw_key = faults[i], i
            i += 1
            node = c.place(fault)
        else:
            fault = Fault(t_recur, c.broken[recur_node], recur_node)
            draw_key, node = -1 - c.out.recurrences, recur_node
            c.out.recurrences += 1
        draws = random.Random(world.seed * 1_000_003 + draw_key)
        how = sim_evidence.manifestation(fault.kind, draws.random(), world.hang_fraction)
        if sim_evidence.SYMPTOMS[fault.kind].node_at_fault and draws.random() < world.bad_node_p:
            c.broken[node] = fault.kind
        t_fault = c.t
        c.faults_on[node] = c.faults_on.get(node, 0) + 1
        if c.faults_on[node] >= world.site_drain_after:  # the site's health checks drain it; both strategies
            c.broken.pop(node, None)
        c.in_place = c.flushed = False
        cls = c.respond(fault, node, how, last_step)
        lost = seg.lost_s
        if snapshot_every is not None and (c.in_place or c.flushed):  # resumed from the newest snapshot
            lost = min(seg.lost_s, (seg.kept_s + seg.lost_s) % snapshot_every)
            c.out.buckets["productive"] += seg.lost_s - lost
            c.restore_point = c.out.buckets["productive"]
        persisted = strategy.memory_persist_s is not None and t_fault - up >= strategy.memory_persist_s + strategy.write_s
        if snapshot_every is not None and c.in_place:
            c.kept_in_memory.append(t_fault)
        elif not (snapshot_every is not None and c.flushed and persisted):
            c.fault_times.append(t_fault)
        c.out.buckets["lost_work"] += lost
        c.out.badput_by_class[cls] = c.out.badput_by_class.get(cls, 0.0) + lost
        c.out.interruptions[cls] = c.out.interruptions.get(cls, 0) + 1
    if recorder is not None:
        recorder.finished(horizon, c.step)
    return c.out


@dataclass(frozen=True)
class Optimum:
    """(c): Young/Daly's best for the supervised strategy's stall and restart at the trace's own MTBF."""

    mtbf_s: float
    stall_s: float
    restart_s: float
    interval_s: float
    goodput: float  # first order: 1 - sqrt(2 delta / M) - R / M
    goodput_daly: float  # Daly's exponential model at his interval

    def to_dict(self) -> dict[str, float]:
        return {k: round(v, 5) for k, v in self.__dict__.items()}


def optimum(world: World, faults: Sequence[Fault], stall_s: float, restart_s: float) -> Optimum:
    mtbf = world.horizon_s / max(1, len(faults))
    return Optimum(mtbf, stall_s, restart_s, ci.young_interval(stall_s, mtbf), ci.best_goodput(stall_s, restart_s, mtbf),
                   ci.goodput_daly(ci.daly_interval(stall_s, mtbf), stall_s, restart_s, mtbf))  # fmt: skip


"""Why did the training step stop? Evidence in, one :class:`Interruption` out. Pure.

Every source (Slurm job and node state, signals the batch step got and when, ranks' SIGTERM flags, exit codes,
detections, log lines, GPU health) is turned into *findings*; the finding with the highest priority names the
class (a weak finding, confidence < 0.5, decides only when nothing credible was found). Priorities encode
causality: an outside decision (preemption, time limit, cancel) explains everything
that follows it; a dead node explains its peers' communication errors and hangs; a process that crashed
*before* the others stalled explains the stall; communication errors are the usual *consequence* of some other
failure, so they only win when nothing else is found. See docs/decisions.md for the table.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import replace

from supervisor.decisions import events as ev
from supervisor.decisions.detect.findings import (
    GLOBAL_STALL,
    LOSS_DIVERGED,
    NODE_LOST,
    NODE_SILENT,
    NONFINITE_LOSS,
    RANK_EXITED,
    RANK_HANG,
    RANK_STOPPED,
)
from supervisor.decisions.interruption import (
    AGENT,
    PROGRAM,
    SLURM,
    Evidence,
    Finding,
    Interruption,
    RankExit,
)
from supervisor.decisions.log_signatures import DEFAULT_LOG_SIGNATURES, MATCH_CHARS, LogSignature, verdict
from supervisor.decisions.tasklog import (
    LogLine,
    address_book,
    named_peers,
    rank_of,
    split_label,
    torchrun_wrapper_lines,
)

# Higher wins. "killed" (an outside SIGKILL: OOM killer, an admin) is reported as class unknown, but it is a
# root cause, so it outranks the communication errors it triggers on the peers.
PRIORITY: dict[str, int] = {
    ev.PREEMPTION: 100,
    ev.TIMEOUT: 90,
    ev.CANCELLED: 80,
    ev.NODE_FAILURE: 70,
    ev.HARDWARE: 60,
    ev.NUMERICAL: 50,
    ev.HANG: 40,
    ev.APP_ERROR: 30,
    "killed": 25,
    ev.COMM_ERROR: 20,
    ev.UNKNOWN: 10,
}
PROGRAM_CERTAIN = frozenset({"cuda-device-assert", "cuda-oom", "nccl-invalid-usage"})  # never a GPU's fault
NO_BLAME = frozenset({ev.PREEMPTION, ev.TIMEOUT, ev.CANCELLED, ev.NUMERICAL, ev.UNKNOWN, "killed"})
APP_ERROR_WINDOW = 3  # earlier app errors looked at when asking "does it repeat on one node only?"
UNKNOWN_SLURM_FACTOR = 0.85  # confidence factor when Slurm's job state could not be read

SIGNAL_NAMES = {1: "SIGHUP", 2: "SIGINT", 4: "SIGILL", 6: "SIGABRT", 7: "SIGBUS", 8: "SIGFPE", 9: "SIGKILL",
                11: "SIGSEGV", 13: "SIGPIPE", 15: "SIGTERM"}  # fmt: skip
_BAD_NODE_STATES = ("DOWN", "NOT_RESPONDING", "FAIL", "FAILING", "POWERED_DOWN", "POWER_DOWN", "NO_RESPOND")


def node_state_is_bad(state: str) -> bool:
    """Slurm node states as scontrol ("DOWN+NOT_RESPONDING"), sinfo ("down*", "idle*") or JSON print them."""
    text = state.upper().strip()
    parts = re.split(r"[+,\s]+", text.replace("*", ""))
    return text.endswith("*") or any(part in _BAD_NODE_STATES for part in parts)


def _group(node: str | None, rank: int | None) -> str | None:
    if node is None and rank is None:
        return None
    return f"{node}/{rank}" if rank is not None else f"{node}/*"


def _slurm_findings(e: Evidence) -> list[Finding]:
    found = []
    state = (e.job_state or "").upper()
    reason = e.job_reason or ""
    if "PREEMPT" in state or "PREEMPT" in reason.upper():
        found.append(Finding(ev.PREEMPTION, 0.95, f"Slurm job state {state or '?'}, reason {reason or '-'}"))
    if e.preempt_time:
        found.append(Finding(ev.PREEMPTION, 0.9, f"Slurm set the job's preempt_time ({e.preempt_time:.0f})"))
    if "TIMEOUT" in state or "DEADLINE" in state:
        found.append(Finding(ev.TIMEOUT, 0.95, f"Slurm job state {state}"))
    if "NODE_FAIL" in state or "BOOT_FAIL" in state:
        found.append(Finding(ev.NODE_FAILURE, 0.9, f"Slurm job state {state}"))
    match = re.search(r"failure of node[s]? (?P<node>[\w.\-\[\],]+)|failed on node (?P<n2>[\w.\-]+)", reason)
    if match:
        node = match.group("node") or match.group("n2")
        found.append(Finding(ev.NODE_FAILURE, 0.9, f"Slurm reason: {reason}", _expand(node, _job_nodes(e))))
    if "OUT_OF_MEMORY" in state:
        found.append(Finding(ev.APP_ERROR, 0.8, "Slurm job state OUT_OF_MEMORY (the program exceeded its memory)"))
    if "CANCELLED" in state and not found:  # the job's state: killing a step never cancels the job
        found.append(Finding(ev.CANCELLED, 0.9, f"Slurm job state {state} (cancelled by a user or an admin)"))
    for name, t in e.batch_signals:
        name = name.upper().removeprefix("SIG")
        near_end = e.end_time is not None and e.end_time - t <= e.signal_lead_s + 90.0
        if e.preempt_time:
            found.append(Finding(ev.PREEMPTION, 0.9, f"batch step got SIG{name} with preempt_time set"))
        elif name == "USR1" and near_end:
            assert e.end_time is not None
            found.append(Finding(ev.TIMEOUT, 0.9, f"batch step got SIGUSR1 {e.end_time - t:.0f}s before the time limit"))
        elif name == "USR1":
            found.append(Finding(ev.PREEMPTION, 0.5, "batch step got SIGUSR1 far from the time limit and no "
                                 "preempt_time: taken as a preemption or a requested requeue"))  # fmt: skip
        elif name == "TERM" and _at_time_limit(e, t) and "CANCELLED" not in state:
            found.append(Finding(ev.TIMEOUT, 0.8, "batch step got SIGTERM at the time limit"))
        elif name == "TERM":  # the supervisor never signals its own batch step: this came from outside
            why = "the job has no known time limit" if e.scheduled_end is None else "before the time limit"
            found.append(Finding(ev.CANCELLED, 0.6, f"batch step got SIGTERM and {why}: scancel (or a requeue "
                                 "from outside)"))  # fmt: skip
    got_usr1 = any(name.upper().removeprefix("SIG") == "USR1" for name, _ in e.batch_signals)
    if e.time_limit_near is not None and not e.preempt_time and not got_usr1:
        end = e.end_time or e.scheduled_end
        left = f"{end - e.time_limit_near:.0f} s" if end else "less than the warning's lead"
        found.append(Finding(ev.TIMEOUT, 0.85, f"the time limit is {left} away and Slurm's warning (USR1) never "
                             "reached the supervisor: its own clock says so"))  # fmt: skip
    if e.sigterm_ranks and not e.supervisor_killed:
        ranks = ", ".join(str(r) for r in sorted(e.sigterm_ranks)[:8])
        if e.preempt_time:
            found.append(Finding(ev.PREEMPTION, 0.9, f"ranks {ranks} got SIGTERM with preempt_time set"))
        else:
            found.append(Finding(ev.PREEMPTION, 0.4, f"ranks {ranks} got SIGTERM from outside the supervisor; "
                                 "Slurm did not say why: treated as a preemption"))  # fmt: skip
    return found


def _at_time_limit(e: Evidence, t: float) -> bool:
    """Whether a TERM at ``t`` is the time limit: only a job with a time limit (``scheduled_end``) times out, at
    or after it, and only while its EndTime was not moved earlier (scancel moves it to the moment of the cancel).
    A TERM without a known time limit is never a timeout."""
    limit = e.scheduled_end
    if limit is None:
        return False
    if e.end_time is not None and e.end_time < limit - 30.0:
        return False
    return t >= limit - 5.0


def _job_nodes(e: Evidence) -> frozenset[str]:
    """Every node of this job the evidence knows: a name from a message is blamed only when it is one of these."""
    return frozenset((*e.allocation_nodes, *e.task_nodes, *e.job_nodes, *e.node_states))


def _expand(expr: str, known: frozenset[str]) -> tuple[str, ...]:
    """The job's nodes a hostlist names (Slurm's reason or message); none when it is malformed or names more
    nodes than the job has (it is not about this job, or not Slurm's)."""
    from slurm.errors import SlurmError
    from slurm.hostlist import expand  # pure string helper

    try:
        return tuple(n for n in expand(expr, limit=max(1, len(known))) if n in known)
    except SlurmError:
        return ()


def _exit_findings(e: Evidence) -> list[Finding]:
    found = []
    exits = list(e.rank_exits)
    seen = {(x.node, x.rank) for x in exits}
    for t, d in e.detections:  # rank_exited detections are exits too
        if d.kind == RANK_EXITED:
            code = None if d.value is None else int(d.value)
            for rank, node in zip(d.ranks, d.nodes * len(d.ranks), strict=False):
                if (node, rank) not in seen:
                    exits.append(RankExit(node, rank, code, t=t))
    for x in exits:
        sig = x.signal_number()
        who = f"rank {x.rank} on {x.node}" if x.rank is not None else f"a rank on {x.node}"
        group = _group(x.node, x.rank)
        if sig is not None:
            name = SIGNAL_NAMES.get(sig, f"signal {sig}")
            if e.supervisor_killed and sig in (9, 15):
                continue
            if sig == 7:  # a hardware suspect: also a file it had mapped was truncated, or /dev/shm ran out
                found.append(Finding(ev.APP_ERROR, 0.6, f"{who} died of SIGBUS (a file it had mapped was cut short, "
                                     "/dev/shm ran out, or a memory or device error)", (), group, x.t, suspect=True))  # fmt: skip
            elif sig == 9:
                found.append(Finding("killed", 0.6, f"{who} was killed by SIGKILL (OOM killer or an outside kill)",
                                     (), group, x.t))  # fmt: skip
            elif sig in (15, 2, 1):
                found.append(Finding(ev.UNKNOWN, 0.3, f"{who} was terminated by {name}", (), group, x.t))
            else:
                found.append(Finding(ev.APP_ERROR, 0.8, f"{who} crashed with {name}", (), group, x.t))
        elif x.exit_code:
            found.append(Finding(ev.APP_ERROR, 0.6, f"{who} exited with code {x.exit_code}", (), group, x.t))
    return found


def _detection_findings(e: Evidence) -> list[Finding]:
    found = []
    silent = {n for _, d in e.detections if d.kind == NODE_SILENT for n in d.nodes}
    everyone_silent = bool(silent) and bool(e.allocation_nodes) and silent.issuperset(e.allocation_nodes)
    if everyone_silent:  # all nodes at once is far likelier our own link or the agents' step than every node
        found.append(Finding(ev.UNKNOWN, 0.5, f"all {len(e.allocation_nodes)} node agents are silent: the "
                             "supervisor's network or the agent step failed, not (only) the nodes"))  # fmt: skip
    for t, d in e.detections:
        text = d.evidence[0] if d.evidence else d.kind
        if d.kind == NODE_SILENT and not everyone_silent:
            # A silent agent blames its node only on complete evidence: the step's nodes are known (so this is
            # not "everyone silent") and Slurm's state of the node was read.
            known = tuple(n for n in d.nodes if e.allocation_nodes and n in e.node_states)
            unknown = sorted(set(d.nodes) - set(known))
            note = f" (not blamed: {'the step nodes' if not e.allocation_nodes else 'Slurm state'} unknown for " \
                   f"{', '.join(unknown)})" if unknown else ""  # fmt: skip
            found.append(Finding(ev.NODE_FAILURE, 0.5, f"node agent silent: {text}{note}", known, t=t))
        elif d.kind == NODE_LOST:  # silent past the learned timeout and confirmed by a probe or Slurm
            found.append(Finding(ev.NODE_FAILURE, 0.9, text, d.nodes, t=t))
        elif d.kind in (NONFINITE_LOSS, LOSS_DIVERGED):
            found.append(Finding(ev.NUMERICAL, 0.9, text, (), t=t))
        elif d.kind in (RANK_HANG, RANK_STOPPED):
            found.append(Finding(ev.HANG, 0.9, text, d.nodes, t=t))
        elif d.kind == GLOBAL_STALL:
            found.append(Finding(ev.HANG, 0.7, text, (), t=t))
    return found


def _with_rank(line: LogLine, task_nodes: Sequence[str]) -> LogLine:
    """Fill in the writer's rank (torch's ``[rankN]:``, else srun's label) and node (srun's label through the task
    layout). The two differ under ``srun torchrun``, where srun's task is a node's torchrun."""
    task, _ = split_label(line.text)
    rank, _ = rank_of(line.text)
    rank = line.rank if line.rank is not None else rank
    node = line.node
    where = task if task is not None else rank
    if node is None and where is not None and 0 <= where < len(task_nodes):
        node = task_nodes[where]
    return line if (rank, node) == (line.rank, line.node) else LogLine(line.text, node, rank)


def _address_book(e: Evidence) -> dict[str, str]:
    return address_book((*e.allocation_nodes, *e.task_nodes, *e.node_states), e.node_addresses)


def _log_findings(e: Evidence, signatures: Sequence[LogSignature]) -> list[Finding]:
    found = []
    book: dict[str, str] | None = None  # built on the first comm error: at 16k nodes it costs ~10 ms
    known = _job_nodes(e)
    wrapper = torchrun_wrapper_lines([x.text for x in e.log_lines])  # torchrun's report of a worker's end
    for line in (_with_rank(x, e.task_nodes) for i, x in enumerate(e.log_lines) if i not in wrapper):
        program = line.rank is not None or split_label(line.text)[0] is not None  # a rank's text, not Slurm's
        text = rank_of(line.text)[1][:MATCH_CHARS]
        for sig in signatures:
            if sig.slurm and program:
                continue  # a rank's output never speaks for Slurm (docs/security.md)
            m = sig.pattern.search(text)
            if m is None:
                continue
            cls, confidence, meaning = verdict(sig, m)
            nodes: tuple[str, ...] = ()
            if "node" in sig.pattern.groupindex and m.group("node"):
                nodes = _expand(m.group("node"), known)
            elif cls == ev.HARDWARE and line.node:
                nodes = (line.node,)
            elif cls == ev.COMM_ERROR:
                book = _address_book(e) if book is None else book
                nodes = named_peers(text, book, line.node)
            where = f" [{line.node}{'' if line.rank is None else f' rank {line.rank}'}]" if line.node else ""
            found.append(Finding(cls, confidence, f"log{where}: {line.text.strip()[:200]} ({meaning})", nodes,
                                 _group(line.node, line.rank), suspect=sig.suspect,
                                 source=PROGRAM if program else SLURM, signature=sig.name))  # fmt: skip
            break
    return found


def _node_state_findings(e: Evidence) -> list[Finding]:
    found = []
    # A bad node outside this launch's nodes did not end it: a node lost earlier and replaced by a spare stays
    # DOWN in the allocation (every later ending would be blamed on it), a spare lost meanwhile interrupts nothing.
    launch_nodes = set(e.allocation_nodes)
    for node, state in sorted(e.node_states.items()):
        if node_state_is_bad(state) and (not launch_nodes or node in launch_nodes):
            found.append(Finding(ev.NODE_FAILURE, 0.9, f"Slurm node {node} is {state}", (node,), source=SLURM))
    return found


def _health_findings(e: Evidence) -> list[Finding]:
    """The node agents' fatal health findings (a hardware Xid, ECC, a lost GPU): hardware evidence."""
    return [Finding(ev.HARDWARE, 0.9, f"health check on {node}: {problem}", (node,), source=AGENT)
            for node, problems in sorted(e.gpu_faults.items()) for problem in problems]  # fmt: skip


def _corroborated(findings: list[Finding], e: Evidence) -> list[Finding]:
    """A hardware suspect (an illegal address, a failed launch, a SIGBUS) becomes ``hardware`` blaming its node
    when that node's health check found a hardware fault; otherwise it stays the program's (or the network's)."""
    unfit = set(e.gpu_faults)
    out = []
    for f in findings:
        if f.suspect and f.where in unfit:
            assert f.where is not None
            f = replace(f, cls=ev.HARDWARE, confidence=max(f.confidence, 0.85), nodes=(f.where,), suspect=False,
                        text=f"{f.text}; corroborated by the health check on {f.where}")  # fmt: skip
        out.append(f)
    return out


def _seen_by(source: str, findings: list[Finding]) -> list[Finding]:
    return [f if f.source else replace(f, source=source) for f in findings]


def _drop_consequences(findings: list[Finding]) -> list[Finding]:
    """Remove findings explained by another: app-level errors caused by communication failures on the same
    rank (a gloo error surfaces as a Python traceback and exit 1), and hangs that began after a rank died."""
    comm_groups = {f.group for f in findings if f.cls == ev.COMM_ERROR and f.group is not None}
    comm_nodes = {g.split("/")[0] for g in comm_groups}
    comm_ranks = {g.split("/")[1] for g in comm_groups} - {"*"}  # ranks are unique: a line's node may be unknown
    kept = []
    for f in findings:
        if f.cls == ev.APP_ERROR and f.group is not None:
            node, rank = f.group.split("/")
            if f.group in comm_groups or f"{node}/*" in comm_groups or (rank == "*" and node in comm_nodes) \
                    or rank in comm_ranks:  # fmt: skip
                continue
        kept.append(f)
    death_times = [f.t for f in kept if f.cls in (ev.APP_ERROR, "killed", ev.HARDWARE) and f.t is not None]
    if death_times:
        first_death = min(death_times)
        kept = [f for f in kept if not (f.cls == ev.HANG and f.t is not None and f.t > first_death)]
    return kept


def _combine(confidences: Iterable[float]) -> float:
    miss = 1.0
    for c in confidences:
        miss *= 1.0 - c
    return round(min(0.99, 1.0 - miss), 3)


def after_clean_end(e: Evidence) -> tuple[Evidence, tuple[str, ...]]:
    """``e`` with each signal death of a rank whose program had ended normally (``ended_clean_ranks``: atexit ran
    with no unhandled exception) read as exit code 0, and a line saying so for each: what dies then is a
    library's destructor in the interpreter's teardown (gloo's abort at exit, pytorch#179291; a CUDA or NCCL
    context's segfault), or a rank srun terminated because such a peer died (``--kill-on-bad-exit``); no
    training was lost. A rank that raised, or exited with a code of its own, is left as it is."""
    ended = set(e.ended_clean_ranks)
    if not ended:
        return e, ()
    exits, notes = [], []
    for x in e.rank_exits:
        sig = x.signal_number()
        if x.rank in ended and sig is not None:
            exits.append(replace(x, exit_code=0, signal=None))
            notes.append(f"rank {x.rank} on {x.node} died of {SIGNAL_NAMES.get(sig, f'signal {sig}')} after its "
                         "program had ended normally (the interpreter's teardown, or srun ending the step with a "
                         "peer): no training lost")  # fmt: skip
        else:
            exits.append(x)
    return replace(e, rank_exits=tuple(exits)), tuple(notes)


def classify(e: Evidence, signatures: Sequence[LogSignature] = DEFAULT_LOG_SIGNATURES) -> Interruption:
    """One class, the nodes to blame, a confidence in [0, 1] and the evidence lines (the winner's first)."""
    e, teardown = after_clean_end(e)
    findings = (
        _seen_by(SLURM, _slurm_findings(e))
        + _node_state_findings(e)
        + _health_findings(e)
        + _seen_by(AGENT, _detection_findings(e))
        + _seen_by(PROGRAM, _exit_findings(e))
        + _log_findings(e, signatures)
    )
    findings = _drop_consequences(_corroborated(findings, e))
    top = max((PRIORITY[f.cls] for f in findings), default=0)
    clean = bool(e.rank_exits) and all(x.exit_code == 0 and not x.signal for x in e.rank_exits)
    if top <= PRIORITY[ev.APP_ERROR] and (clean or (not findings and (e.job_state or "").upper() == "COMPLETED")):
        # every rank exited 0: log noise (a peer closing its socket at teardown) does not make a failure
        reason = "every rank exited with code 0" if clean else f"Slurm job state {e.job_state}"
        if clean and teardown:
            reason = "every rank's program ended normally"
        return Interruption(ev.COMPLETED, (), 0.95, (reason, *teardown[:8],
                                                     *(f"(also: {f.text})" for f in findings[:8])))
    if not findings:
        return Interruption(ev.UNKNOWN, (), 0.1, ("no evidence explains the stop",))
    credible = [f for f in findings if f.confidence >= 0.5] or findings  # weak hints decide only alone
    top = max(PRIORITY[f.cls] for f in credible)
    winners = [f for f in credible if PRIORITY[f.cls] == top]
    cls = winners[0].cls
    origin = tuple(sorted({f.where for f in winners if f.where} | {n for f in winners for n in f.nodes}))
    origin_ranks = tuple(sorted({int(r) for f in winners if f.group for r in [f.group.split("/")[1]] if r.isdigit()}))
    blamed: tuple[str, ...] = ()
    notes: list[str] = []
    if cls not in NO_BLAME:
        blamed = tuple(sorted({n for f in winners if f.confidence >= 0.5 for n in f.nodes}))
    if cls == ev.NODE_FAILURE and blamed:
        # a silent agent alone is weak; Slurm's word on the same node confirms it
        confirmed = {n for f in winners if f.confidence >= 0.9 for n in f.nodes}
        blamed = tuple(sorted(confirmed)) if confirmed else blamed
    elif cls == ev.COMM_ERROR and len(blamed) > 1:
        step_nodes = set(e.task_nodes) | set(e.allocation_nodes)
        if not step_nodes or step_nodes <= set(blamed):  # every node named by another: the network, not a node
            notes.append(f"(not blamed: the errors name every node: {', '.join(blamed)})")
            blamed = ()
    elif cls == ev.APP_ERROR:
        node = repeated_on_one_node(origin, e.app_error_history, origin_ranks=origin_ranks,
                                    rank_history=e.app_error_rank_history)  # fmt: skip
        blamed = (node,) if node else ()
        # a GPU-level error the program certainly caused (a kernel's assert, out of memory) settles it
        suspect = any(f.suspect for f in winners) and not any(f.signature in PROGRAM_CERTAIN for f in winners)
        if node and suspect and repeated_on_one_node(origin, e.app_error_history, origin_ranks=origin_ranks,
                                                     rank_history=e.app_error_rank_history, ranks_moved=True):
            cls = ev.HARDWARE  # the same GPU-level error on one node, whichever ranks run there: the GPU's
            notes.append(f"the GPU-level error repeats on {node} after the ranks moved, and on no other node: "
                         f"{node}'s hardware is blamed")  # fmt: skip
        elif node:
            notes.append(f"the application error repeats on {node} and on no other node: {node} is blamed")
        elif repeated_on_one_node(origin, e.app_error_history):
            notes.append(f"(not blamed: it repeats on {origin[0]}, but always from rank(s) "
                         f"{', '.join(map(str, origin_ranks))}: it may follow the rank; the next launch moves the "
                         "ranks to other nodes to tell)")  # fmt: skip
        if suspect and cls == ev.APP_ERROR:
            notes.append("(a GPU-level error without hardware evidence: the program's, unless its node's health "
                         "check finds a fault or it repeats on that node after the ranks moved)")  # fmt: skip
    witnesses = tuple(sorted({f.source for f in winners if f.source and set(f.nodes) & set(blamed)}))
    if blamed and not witnesses:
        witnesses = (PROGRAM,)  # blamed on where the program's crashes keep happening
    others = sorted((f for f in findings if f not in winners), key=lambda f: -PRIORITY[f.cls])
    evidence = [f.text for f in winners] + notes + [f"(also: {f.text})" for f in others]
    confidence = _combine(f.confidence for f in winners)
    if e.job_state is None:  # an outside decision (preemption, time limit, cancel) may be what we cannot see
        confidence = round(confidence * UNKNOWN_SLURM_FACTOR, 3)
        evidence.insert(len(winners), "(Slurm's job state is unknown: the query failed; confidence lowered)")
    return Interruption(
        cls="unknown" if cls == "killed" else cls,
        blamed_nodes=blamed,
        confidence=confidence,
        evidence=tuple(evidence[:24]),
        origin_nodes=origin,
        origin_ranks=origin_ranks,
        witnesses=witnesses if blamed else (),
    )


def repeated_on_one_node(origin: Sequence[str], history: Sequence[Sequence[str]],
                         window: int = APP_ERROR_WINDOW, *, origin_ranks: Sequence[int] = (),
                         rank_history: Sequence[Sequence[int]] = (), ranks_moved: bool = False) -> str | None:  # fmt: skip
    """The node to blame for an application error, if any: this one happened on one node only, an earlier one
    (among the last ``window`` whose node is known) happened there too, and none of them happened elsewhere. A
    bug in the program crashes wherever it runs; a crash that keeps to one machine is that machine's.

    With the ranks known (``origin_ranks``, ``rank_history`` aligned with ``history``), an earlier crash there
    confirms the node only when it came from other ranks: a crash of the same rank on the same node may follow
    the rank (a rank-0-only bug on the node rank 0 always lands on), so the node is blamed only once the ranks
    moved (the supervisor moves them after such a crash) and the crash stayed. ``ranks_moved`` asks for that proof
    even when this crash's ranks are unknown: an earlier crash there from known, other ranks."""
    if len(set(origin)) != 1:
        return None
    node = origin[0]
    ranks = list(rank_history)[-len(history):] if rank_history else []
    ranks = [()] * (len(history) - len(ranks)) + ranks
    known = [(set(o), tuple(sorted(r))) for o, r in zip(history, ranks, strict=True) if o][-window:]
    if any(o - {node} for o, _ in known):
        return None
    here = tuple(sorted(origin_ranks))
    if ranks_moved and not here:
        return None
    moved = [o == {node} and bool(r) and r != here for o, r in known]
    if ranks_moved and not any(moved):
        return None
    if not any(o == {node} and not (here and r == here) for o, r in known):
        return None
    return node

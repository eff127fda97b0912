"""Agent main loop: sample slots ~4 Hz, report ~1 Hz (at once on a change), obey the supervisor, and exit
when the supervisor is gone.

WHY exit on silence: the agent is an overlapping srun step; if the supervisor dies it must not linger
holding the slot directory, so it needs authenticated keepalives (every ~2 s) and leaves after
``--supervisor-timeout`` seconds without one (sooner when the kernel reports the supervisor's port closed).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import select
import shutil
import signal
import socket
import stat
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from supervisor.agent.discover import find_ranks
from supervisor.agent.failsafe import Failsafe
from supervisor.agent.health_thread import HealthThread, health_from_args
from supervisor.agent.memory_thread import make_store
from supervisor.agent.memory_tier import MemoryTier
from supervisor.agent.rank_orders import kill_rank, write_rank_orders
from supervisor.agent.replication_wire import replication_key
from supervisor.agent.sampler import RankSlots
from supervisor.agent.slotdir import make_slot_dir
from supervisor.agent.stacks import StackDumps
from supervisor.checkpoint.memory import MEMORY_DIR_ENV
from supervisor.client.slot import check_slot_dir
from supervisor.errors import ConfigError, SupervisorError, UsageError
from supervisor.heartbeat import wire
from supervisor.heartbeat.orders import OrderError, Orders, parse_orders
from supervisor.heartbeat.secret import load_secret
from supervisor.paths import SLOT_DIR_ENV, CampaignPaths, default_slot_dir, expand_slot_dir

if TYPE_CHECKING:
    from supervisor.health.periodic import AgentHealth

DISCOVER_S = 2.0  # how often /proc is scanned for ranks that have no slot (they never call the client)
LINGER_S = 30.0  # on SIGTERM with snapshots in node memory: the wait for the flush order (Slurm's SIGKILL may end it)


def _change_key(entries: list[wire.RankEntry]) -> tuple[tuple[int, int, int, int], ...]:
    """What makes a summary urgent: a rank appearing/vanishing, a new pid, a state or phase change."""
    return tuple((e.rank, e.pid, e.state, e.phase) for e in entries)


class Agent:
    def __init__(self, *, job: str, node: str, key: bytes, supervisor: tuple[str, int], slot_dir: Path,
                 campaign: Path, sample_s: float = 0.25, report_s: float = 1.0, supervisor_timeout_s: float = 30.0,
                 refused_grace_s: float = 5.0, parent_pid: int = 0, keep_slot_dir: bool = False,
                 health: AgentHealth | None = None,
                 failsafe: Failsafe | None = None, not_before_ns: int = 0, memory: MemoryTier | None = None) -> None:
        self.job, self.node, self.key = job, node, key
        self.sample_s, self.report_s = sample_s, report_s
        self.supervisor_timeout_s, self.refused_grace_s = supervisor_timeout_s, refused_grace_s
        self.parent_pid, self.keep_slot_dir = parent_pid, keep_slot_dir
        self.failsafe = failsafe  # requeue the job when the supervisor and its batch host are gone
        self._gone_since = 0.0
        self.slot_dir = slot_dir
        self.slots = RankSlots(slot_dir)
        self.stacks = StackDumps(slot_dir, CampaignPaths(campaign).stacks, node)
        info = socket.getaddrinfo(supervisor[0], supervisor[1], type=socket.SOCK_DGRAM)[0]
        self.sock = socket.socket(info[0], socket.SOCK_DGRAM)
        self.sock.connect(info[4])  # only the supervisor's address can reach us; port-closed errors surface
        self.sock.setblocking(False)
        self.instance = secrets.randbits(64)
        self.seq = 0
        self.guard = wire.ReplayGuard(not_before_ns=not_before_ns)  # the supervisor's frames from before our start
        self.counters: Counter[str] = Counter()
        self.stop_reason = ""
        self.last_contact = time.monotonic()  # of the supervisor's last authenticated frame (run() restarts it)
        self._next_discover = 0.0
        self._last_key: tuple[tuple[int, int, int, int], ...] | None = None
        self._refused_since = 0.0
        self.clock_offset_s: float | None = None  # our wall clock minus the batch host's (from its frames)
        self.health = HealthThread(health, lambda: self.clock_offset_s) if health is not None else None
        self.memory = memory  # the node's memory store (the memory tier), reported as it changes
        self.linger_s = LINGER_S
        self.lingering: tuple[float, int, str] | None = None  # (since, flushes done then, why) after SIGTERM

    def _header(self) -> dict[str, object]:
        self.seq += 1
        return {"instance": self.instance, "seq": self.seq, "wall_ns": time.time_ns(),
                "mono_ns": time.monotonic_ns(), "job": self.job, "node": self.node}

    def _transmit(self, data: bytes) -> None:
        try:
            self.sock.send(data)
            self.counters["sent"] += 1
        except ConnectionRefusedError:
            self._refused()
        except OSError:
            self.counters["send_errors"] += 1

    def _refused(self) -> None:
        self.counters["refused"] += 1
        if not self._refused_since:
            self._refused_since = time.monotonic()

    def report(self, entries: list[wire.RankEntry]) -> None:
        self._transmit(wire.encode_summary(self.key, ranks=entries, **self._header()))  # type: ignore[arg-type]

    def send_events(self, events: list[wire.Event]) -> None:
        self._transmit(wire.encode_events(self.key, events=events, **self._header()))  # type: ignore[arg-type]

    def handle(self, data: bytes) -> None:
        """One datagram from the supervisor: authenticate, check it is for us, obey."""
        try:
            frame = wire.decode(self.key, data, self.job)
        except wire.FrameError as err:
            self.counters["rejected_" + err.reason] += 1
            return
        if frame.kind not in (wire.KIND_CONTROL, wire.KIND_ORDER) or frame.node != self.node:
            self.counters["rejected_" + ("node" if frame.node != self.node else "kind")] += 1
            return
        why = self.guard.check("supervisor", frame.instance, frame.seq, frame.sent_wall_ns, time.time_ns())
        if why is not None:
            self.counters["rejected_" + why] += 1
            return
        self.counters["control_ok"] += 1
        self.clock_offset_s = (time.time_ns() - frame.sent_wall_ns) / 1e9  # + transit, well under a second
        self.last_contact = time.monotonic()
        self._refused_since = 0.0
        if frame.kind == wire.KIND_ORDER:
            self._obey(wire.order_text(frame))
            return
        events: list[wire.Event] = []
        for cmd in wire.commands(frame):
            ranks = sorted(set(self.slots.readers) | set(self.slots.slotless)) if cmd.rank == wire.ALL_RANKS \
                else [cmd.rank]  # fmt: skip
            if cmd.command == wire.CMD_SET_FLAGS:
                flags, at_step = wire.split_flags_arg(cmd.arg)
                for r in ranks:
                    self.slots.set_flags(r, flags, at_step)
                self._last_key = None  # report the new control flags promptly
            elif cmd.command == wire.CMD_DUMP_STACKS:
                for r in ranks:  # a rank without the client: its process as discovery found it
                    ev = self.stacks.request(r, self.slots.records.get(r), pid=self.slots.slotless.get(r),
                                             started_by=self.slots.slotless_since.get(r))  # fmt: skip
                    if ev is not None:
                        events.append(ev)
            elif cmd.command == wire.CMD_REPORT_MEMORY:
                if self.memory is not None:
                    self.memory.request()
            elif cmd.command == wire.CMD_KILL_RANK and cmd.rank != wire.ALL_RANKS:
                kill_rank(self.slots, cmd.rank, self.counters)
            elif cmd.command == wire.CMD_EXIT:
                self.stop_reason = "the supervisor asked the agent to exit"
        if events:
            self.send_events(events)

    def _obey(self, text: str) -> None:
        """An order of the memory tier (its buddy, shard copies); one that does not parse is counted, not obeyed."""
        try:
            orders = parse_orders(text)
        except OrderError as err:
            self.counters[f"rejected_order_{err}"] += 1
            print(f"supervisor agent: an authenticated order that is not one of ours ({err}) was ignored",
                  file=sys.stderr, flush=True)  # fmt: skip
            return
        if orders.restart is not None or orders.assign is not None:
            orders = write_rank_orders(self.slot_dir, orders, self.counters)
            if orders == Orders():  # nothing for the memory tier in it
                return
        if self.memory is None:
            self.counters["orders_without_memory"] += 1
            return
        self.memory.obey(orders)

    def _receive(self) -> None:
        while True:
            try:
                data = self.sock.recv(wire.MAX_FRAME + 1)
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionRefusedError:
                self._refused()
                return
            except OSError:
                return
            self.handle(data)

    def terminate(self, why: str) -> None:
        """Slurm's SIGTERM (preemption, time limit, scancel): leave, unless this node's memory store holds
        snapshots and no flush has been done. Slurm signals every step of the job at once, so the supervisor's
        flush order (the copy the requeued job resumes from, ``flush_copy``) comes after the agent is told to go:
        it stays up to ``linger_s`` for the order and, once one came, until the copy is done (Slurm's KillWait
        or GraceTime bounds it all with SIGKILL). A second SIGTERM, or a flush already done, ends it at once."""
        memory = self.memory
        if self.lingering is not None or memory is None or not memory.holds_snapshots() \
                or (memory.flusher.finished and not memory.flusher.busy()):  # fmt: skip
            self.stop_reason = why
            return
        self.lingering = (time.monotonic(), memory.flusher.finished, why)
        print(f"supervisor agent: {why}; node memory holds snapshots: staying up to {self.linger_s:g} s for "
              "the supervisor's flush order", file=sys.stderr, flush=True)  # fmt: skip

    def _linger_over(self, now: float) -> str:
        assert self.lingering is not None and self.memory is not None
        since, finished, why = self.lingering
        flusher = self.memory.flusher
        if flusher.busy():
            return ""
        if flusher.finished > finished:
            return f"{why} (after the memory flush)"
        if now - since > self.linger_s:
            return f"{why} (no flush ordered within {self.linger_s:g} s)"
        return ""

    def _should_exit(self, now: float) -> str:
        if self.stop_reason:
            return self.stop_reason
        if self.lingering is not None:
            why = self._linger_over(now)
            if why:
                return why
        fs = self.failsafe
        if fs is not None:
            why = self._failsafe(fs, now)
            if why or fs.waiting and self._gone_since:
                return why  # acted (or found it done); or still waiting for this agent's turn: do not exit yet
        silent = now - self.last_contact
        if silent > self.supervisor_timeout_s:
            return f"no word from the supervisor for {silent:.1f} s"
        if self._refused_since and now - self._refused_since > self.refused_grace_s and silent > self.refused_grace_s:
            return f"the supervisor's port has been closed for {now - self._refused_since:.1f} s"
        if self.parent_pid and not psutil.pid_exists(self.parent_pid):
            return f"watched pid {self.parent_pid} is gone"
        return ""

    def _failsafe(self, fs: Failsafe, now: float) -> str:
        """The supervisor counts as gone after ``fs.timeout_s`` without a control frame, or once the kernel has
        said its port is closed for ``refused_grace_s``; then the failsafe gets its turn."""
        silent = now - self.last_contact
        refused = bool(self._refused_since) and now - self._refused_since > self.refused_grace_s \
            and silent > self.refused_grace_s  # fmt: skip
        if silent <= fs.timeout_s and not refused:
            self._gone_since = 0.0
            return ""
        self._gone_since = self._gone_since or now
        if fs.due(now - self._gone_since, now):
            why = f"no word from the supervisor for {silent:.1f} s" + (" (its port is closed)" if refused else "")
            fs.act(why, time.monotonic())
        return f"the supervisor is gone; failsafe: {fs.done}" if fs.done else ""

    def run(self) -> str:
        """Loop until told to stop; return why it stopped."""
        self.last_contact = time.monotonic()
        next_sample = next_report = time.monotonic()
        first = True
        if self.health is not None:
            self.health.start()  # checks at start, then every interval, off the sampling loop
        if self.memory is not None:
            self.memory.start()
        while True:
            now = time.monotonic()
            if now >= next_sample:
                next_sample = max(next_sample + self.sample_s, now)
                self.slots.scan()
                if now >= self._next_discover:
                    self._next_discover = now + DISCOVER_S
                    self.slots.adopt(find_ranks(self.job, self.node, os.environ.get("SLURM_STEP_ID")))
                entries = self.slots.sample()
                key = _change_key(entries)
                if key != self._last_key or now >= next_report:
                    self.report(entries)
                    self._last_key = key
                    # Spread agents' reports over the second after the first one: no synchronized bursts.
                    jitter = secrets.randbelow(1000) / 1000 if first else 1.0
                    next_report = now + self.report_s * jitter
                    first = False
            done = self.stacks.poll()
            if self.health is not None:
                done += self.health.events()
            if self.memory is not None:
                done += self.memory.events()
            if done:
                self.send_events(done)
            why = self._should_exit(now)
            if why:
                return why
            wait = max(0.0, next_sample - time.monotonic())
            if self.stacks.pending:
                wait = min(wait, 0.05)
            ready, _, _ = select.select([self.sock], [], [], wait)
            if ready:
                self._receive()

    def close(self) -> None:
        if self.health is not None:
            self.health.close()
        if self.memory is not None:
            self.memory.close()
        self.slots.close()
        self.sock.close()
        if not self.keep_slot_dir:
            remove_slot_dir(self.slot_dir)


def remove_slot_dir(slot_dir: Path, tries: int = 3) -> None:
    """Remove the node's slot directory and memory store: a rank still writing a snapshot while the job ends can
    make one pass find a directory not empty (its ranks never make the store again once it is gone)."""
    for attempt in range(tries):
        shutil.rmtree(slot_dir, ignore_errors=True)
        if not slot_dir.exists():
            return
        time.sleep(0.05 * (attempt + 1))


def _parse_hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or len(port) > 5 or not host or not 0 < int(port) < 65536:
        raise UsageError(f"--supervisor {text!r} is not HOST:PORT", "pass e.g. --supervisor batchhost:40123")
    return host.strip("[]"), int(port)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m supervisor.agent", description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--campaign", required=True, help="campaign directory (holds `secret`; stack dumps go there)")
    p.add_argument("--supervisor", help="HOST:PORT of the aggregator (default: from CAMPAIGN/aggregator.json, which the agent reads in any case for this Slurm run's channel key)")
    p.add_argument("--job-id", default=os.environ.get("SLURM_JOB_ID", ""), help="default: $SLURM_JOB_ID")
    p.add_argument("--node", default=os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0],
                   help="node name reported (default: $SLURMD_NODENAME or the short hostname)")
    p.add_argument("--secret-file", help="default: CAMPAIGN/secret")
    p.add_argument("--slot-dir", help=f"default: ${SLOT_DIR_ENV} or /dev/shm/supervisor-JOBID-UID; "
                   "{node}, {job} and {uid} are replaced (several slurmd on one host need a dir per node)")
    p.add_argument("--sample-interval", type=float, default=0.25, help="seconds between slot samples")
    p.add_argument("--report-interval", type=float, default=1.0, help="seconds between summaries")
    p.add_argument("--supervisor-timeout", type=float, default=30.0,
                   help="exit after this many seconds without a keepalive from the supervisor")
    p.add_argument("--parent-pid", type=int, default=0, help="also exit when this pid is gone (same host only)")
    p.add_argument("--keep-slot-dir", action="store_true", help="do not remove the slot directory on exit")
    p.add_argument("--replication-cap-mbs", type=float, default=2000.0,
                   help="MB/s at most for copying memory snapshots to other nodes (default 2000)")
    p.add_argument("--not-before-ns", type=int, default=0,
                   help="refuse the supervisor's frames sent before this time (its wall clock, ns) as replays")
    p.add_argument("--health-interval", type=float, default=30.0,
                   help="seconds between node health checks (the first at start; 0: no checks)")
    p.add_argument("--health-fs", action="append", default=[], metavar="ROLE=PATH",
                   help="a filesystem whose free space and inodes are checked (repeatable)")
    p.add_argument("--health-limit", action="append", default=[], metavar="KEY=VALUE",
                   help="a health threshold (docs/health.md), e.g. fs_min_free_gib=50 (repeatable)")
    p.add_argument("--expect-gpus", type=int, default=None, help="GPUs this node should have (default: unchecked)")
    p.add_argument("--batch-host", help="the job's batch host: enables the failsafe (requeue the job when the "
                   "supervisor and its batch host are gone)")
    p.add_argument("--failsafe-timeout", type=float, default=10.0,
                   help="seconds without a control frame before the failsafe probes the batch host")
    p.add_argument("--job-nodes", default=os.environ.get("SLURM_JOB_NODELIST", ""),
                   help="the job's nodes, a Slurm hostlist (default: $SLURM_JOB_NODELIST)")
    p.add_argument("--restart-count", type=int, default=int(os.environ.get("SLURM_RESTART_COUNT") or 0),
                   help="the job's Slurm restart count in this run (default: $SLURM_RESTART_COUNT)")
    return p


def read_address_file(campaign: Path) -> tuple[tuple[str, int], bytes]:
    """This Slurm run's aggregator address and channel value from ``CAMPAIGN/aggregator.json`` (0600).

    The channel value is mixed into the wire key, so the agent must read it even when ``--supervisor`` names
    the address: it is published only through this private file, never on a command line."""
    path = CampaignPaths(campaign).address
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        raise UsageError(f"no readable {path.name} in the campaign directory {campaign}",
                         "start the agents after the supervisor's aggregator wrote it") from None
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode) or mode & 0o077:
            raise ConfigError(f"{path} is readable by others (mode {stat.S_IMODE(mode):o})", f"run `chmod 600 {path}`")
        raw = fh.read(1 << 16)
    try:
        doc = json.loads(raw)
        channel = bytes.fromhex(doc.get("channel", ""))
        host, port = doc["host"], doc["port"]
        if not isinstance(host, str) or not host or type(port) is not int or not 0 < port < 65536:
            raise ValueError("bad host or port")
        return (host, port), channel
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        raise ConfigError(f"{path} is not an aggregator address file",
                          "let the supervisor rewrite it (restart the Slurm run)") from None


def agent_from_args(args: argparse.Namespace) -> Agent:
    if not args.job_id:
        raise UsageError("no job id", "run inside a Slurm job or pass --job-id")
    campaign = Path(args.campaign)
    if not campaign.is_dir():
        raise ConfigError(f"campaign directory {campaign} does not exist", "pass the directory the supervisor made")
    if min(args.sample_interval, args.report_interval, args.supervisor_timeout) <= 0:
        raise UsageError("intervals and timeouts must be positive", "pass values > 0")
    secret = load_secret(args.secret_file or CampaignPaths(campaign).secret)
    published, channel = read_address_file(campaign)
    supervisor = _parse_hostport(args.supervisor) if args.supervisor else published
    key = wire.derive_key(secret, channel)
    slot_dir = expand_slot_dir(args.slot_dir or os.environ.get(SLOT_DIR_ENV) or str(default_slot_dir(args.job_id)),
                               job=args.job_id, node=args.node)
    try:
        make_slot_dir(slot_dir)
        check_slot_dir(slot_dir)
    except OSError as err:
        raise ConfigError(f"slot directory {slot_dir} is unsafe: {err}", "remove it or pass another --slot-dir") from None
    return Agent(job=args.job_id, node=args.node, key=key, supervisor=supervisor, slot_dir=slot_dir,
                 campaign=campaign, sample_s=args.sample_interval, report_s=args.report_interval,
                 supervisor_timeout_s=args.supervisor_timeout, parent_pid=args.parent_pid,
                 keep_slot_dir=args.keep_slot_dir, health=health_from_args(args),
                 failsafe=failsafe_from_args(args, campaign), not_before_ns=args.not_before_ns,
                 memory=memory_from_env(args, key, supervisor))


def memory_from_env(args: argparse.Namespace, key: bytes, supervisor: tuple[str, int]) -> MemoryTier | None:
    """The memory tier's store on this node when the supervisor asked for one (``SUPERVISOR_MEMORY_DIR``), with
    its copies to and from other nodes; a store that cannot be made leaves the tier off on this node (its ranks'
    writes fail: they turn it off and say so)."""
    template = os.environ.get(MEMORY_DIR_ENV, "")
    if not template:
        return None
    root = expand_slot_dir(template, job=args.job_id, node=args.node)
    try:
        make_store(root)
    except OSError as err:
        print(f"supervisor agent: memory store {root} unusable ({err}); memory snapshots off on this node",
              file=sys.stderr, flush=True)  # fmt: skip
        return None
    return MemoryTier.build(root, replication_key(key), job=args.job_id, node=args.node, supervisor=supervisor,
                               cap_bytes_s=args.replication_cap_mbs * 1e6)  # fmt: skip


def failsafe_from_args(args: argparse.Namespace, campaign: Path) -> Failsafe | None:
    if not args.batch_host:
        return None
    from slurm.hostlist import expand
    from slurm.probe import starter

    if args.failsafe_timeout <= 0:
        raise UsageError("--failsafe-timeout must be positive", "pass seconds > 0, e.g. 10")
    try:
        nodes = expand(args.job_nodes) if args.job_nodes else []
    except ValueError:
        raise UsageError(f"--job-nodes {args.job_nodes!r} is not a Slurm hostlist", "e.g. node[1-3]") from None
    return Failsafe(job_id=args.job_id, node=args.node, batch_host=args.batch_host, nodes=nodes,
                    restart_count=args.restart_count, campaign=campaign,
                    timeout_s=args.failsafe_timeout, start_probe=starter(args.job_id))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        agent = agent_from_args(build_parser().parse_args(argv))
    except SupervisorError as err:
        print(err.one_line(), file=sys.stderr)
        return err.exit_code
    except OSError as err:
        print(f"supervise agent: error: {err}", file=sys.stderr)
        return 1

    def _stop(signum: int, _frame: object) -> None:
        why = f"received {signal.Signals(signum).name}"
        if signum == signal.SIGTERM:
            agent.terminate(why)  # may stay for the memory flush
        else:
            agent.stop_reason = why

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _stop)
    print(f"supervisor agent: node {agent.node} job {agent.job} slots {agent.slot_dir} pid {os.getpid()}",
          file=sys.stderr, flush=True)
    try:
        why = agent.run()
    finally:
        agent.close()
    print(f"supervisor agent: exiting: {why}", file=sys.stderr, flush=True)
    return 0

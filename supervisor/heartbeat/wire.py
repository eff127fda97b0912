"""Authenticated binary frames between node agents and the supervisor (UDP datagrams).

Why UDP datagrams: one self-contained ~750-byte frame per node per second scales to 16k nodes without
16k open connections on the supervisor, a lost frame is simply superseded by the next one (the state
is resent whole every time), and sequence numbers tell loss and reordering apart.  Why binary: a rank
entry is a fixed 88-byte struct, so the supervisor can keep a node's frame as bytes and decode it only
when someone looks (no per-rank Python objects on the hot path).

Frame = header | job id | node name | body | HMAC-SHA256(key, everything before the MAC).
The MAC is checked first (``hmac.compare_digest``), so no attacker-chosen byte is parsed before it is
authenticated; lengths are bounded and parsing is total: every bad frame raises ``FrameError`` with a
short reason that receivers count, and nothing else.  The key is per Slurm run (``derive_key(secret,
channel)``); within a run replays are refused by ``ReplayGuard`` (per-sender instance id + strictly
increasing seq, a freshness window on every frame, and a new instance replaces the current one only when
it was sent after the current one's last frame).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import struct
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from supervisor import procstate

MAGIC = b"SVW1"
VERSION = 4  # 2: rank entries carry checkpoint ms and step; 3: and own time (88 bytes); 4: and restore ms, count
OLD_VERSIONS = (2, 3)  # still decoded (agents of earlier releases): the fields they lack read 0
MAC_LEN = 32
MAX_FRAME = 65000  # below the 65,507-byte UDP payload limit
MAX_NAME = 255
MAX_TEXT = 4096

KIND_SUMMARY = 1  # agent -> supervisor: per-rank table of one node
KIND_CONTROL = 2  # supervisor -> agent: keepalive, flags, stack dump requests, exit
KIND_EVENT = 3  # agent -> supervisor: one-off events (stack dump saved, ...)
KIND_ORDER = 4  # supervisor -> agent: one JSON order too rich for a command (the memory tier's buddy, a shard copy)
KINDS = (KIND_SUMMARY, KIND_CONTROL, KIND_EVENT, KIND_ORDER)
MAX_ORDER = 16384

# magic, version, kind, item count, sender instance, seq, send wall ns, send monotonic ns, len(job), len(node)
HEADER = struct.Struct("<4sBBHQQqQBB")

# One rank, 84 bytes: rank, pid, step, phase, state, rank flags, control flags, beat age ms,
# iteration EWMA / min / max seconds, last loss, step of that loss (-1: no loss ever given, then the loss
# is NaN and means nothing), beats, exit code, exit signal, rank flags' high byte (bits 8-15: a byte that was
# padding, 0 in every older agent's frames, so no version change), cpu seconds, checkpoint ms (time the
# process spent in checkpoint phases, measured by the client, modulo 2**32), step of its last checkpoint (-1),
# own-time EWMA seconds (step time less collective waits; 0: not measured), restore ms (time the process spent
# loading its state in restore phases, modulo 2**32), restores (how many such phases ended). Version 2's entries
# end before own time, version 3's before restore ms.
RANK = struct.Struct("<IIqBBBBIfffdqQhBBdIqfII")
RANK_SIZES = {2: 84, 3: 88, VERSION: RANK.size}
MAX_RANKS = (MAX_FRAME - HEADER.size - 2 * MAX_NAME - MAC_LEN) // RANK.size

# One control command, 16 bytes: command, (pad), rank (ALL_RANKS = every rank), argument.
COMMAND = struct.Struct("<BxxxIQ")
MAX_COMMANDS = 1024
ALL_RANKS = 0xFFFFFFFF
CMD_KEEPALIVE = 0
CMD_SET_FLAGS = 1  # arg = flags_arg(control flags for the rank's slot, at_step)
CMD_DUMP_STACKS = 2
CMD_EXIT = 3
CMD_REPORT_MEMORY = 4  # send the memory store's inventory now (before a relaunch picks a snapshot)
CMD_KILL_RANK = 5  # SIGKILL this one rank's process (a hung rank, before a warm restart); never ALL_RANKS
COMMAND_NAMES = ("keepalive", "set_flags", "dump_stacks", "exit", "report_memory")

# One event: kind, rank, text length, then UTF-8 text.
EVENT = struct.Struct("<BIH")
EVENT_STACKS_SAVED = 1  # text = path of the saved dump
EVENT_STACKS_FAILED = 2  # text = why
EVENT_HEALTH = 3  # text = a node health report (JSON, ``encode_health``); rank = the agent's check number
EVENT_MEMORY = 4  # text = what the node's memory store holds (JSON, ``memory_report.encode_memory``)
EVENT_NAMES = ("", "stacks_saved", "stacks_failed", "health", "memory")

# Process states travel as one byte: the code of a name in ``supervisor.procstate`` (the one vocabulary).
STATES = procstate.NAMES
ST_UNKNOWN, ST_RUNNING, ST_SLEEPING = procstate.CODES["unknown"], procstate.CODES["running"], procstate.CODES["sleeping"]
ST_DISK, ST_STOPPED, ST_ZOMBIE = procstate.CODES["disk_wait"], procstate.CODES["stopped"], procstate.CODES["zombie"]
ST_GONE, ST_EXITED, ST_NO_PID = procstate.CODES["gone"], procstate.CODES["exited"], procstate.CODES["no_pid"]

NO_BEAT = 0xFFFFFFFF  # beat_age_ms when the rank never beat
EXIT_UNKNOWN = -1


class FrameError(ValueError):
    """A frame was refused; ``reason`` is a short counter name (``mac``, ``short``, ``job``...)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class RankEntry(NamedTuple):
    rank: int
    pid: int
    step: int
    phase: int
    state: int
    rank_flags: int
    control_flags: int
    beat_age_ms: int
    ewma_s: float
    min_s: float
    max_s: float
    loss: float
    loss_step: int
    beats: int
    exit_code: int
    exit_signal: int
    cpu_s: float
    ckpt_ms: int = 0
    ckpt_step: int = -1
    own_s: float = 0.0  # own time per step, EWMA (collective waits excluded); 0: the rank does not measure it
    restore_ms: int = 0  # time the process spent in restore phases (client-measured, ms, modulo 2**32)
    restores: int = 0  # restore phases it ended (0: it never marked one, or an older agent)


class Command(NamedTuple):
    command: int
    rank: int = ALL_RANKS
    arg: int = 0


class Event(NamedTuple):
    kind: int
    rank: int
    text: str


class Frame(NamedTuple):
    kind: int
    items: int
    instance: int
    seq: int
    sent_wall_ns: int
    sent_mono_ns: int
    job: str
    node: str
    body: bytes


def derive_key(secret: bytes, channel: bytes = b"") -> bytes:
    """The wire key: domain-separated from the raw campaign secret (which may be reused elsewhere) and mixed
    with ``channel``, a fresh random value per Slurm run, so frames recorded in one run of the campaign never
    authenticate in another (the secret is the same for every run)."""
    return hmac.digest(secret, b"slurm-supervisor wire v1" + (b"\x00" + channel if channel else b""), hashlib.sha256)


def _name(text: str) -> bytes:
    raw = text.encode("utf-8")
    if len(raw) > MAX_NAME:
        raise ValueError(f"name longer than {MAX_NAME} bytes: {text[:40]!r}...")
    return raw


def _seal(key: bytes, kind: int, count: int, instance: int, seq: int, wall_ns: int, mono_ns: int,
          job: str, node: str, body: bytes) -> bytes:
    job_b, node_b = _name(job), _name(node)
    head = HEADER.pack(MAGIC, VERSION, kind, count, instance, seq, wall_ns, mono_ns, len(job_b), len(node_b))
    msg = b"".join((head, job_b, node_b, body))
    if len(msg) + MAC_LEN > MAX_FRAME:
        raise ValueError(f"frame of {len(msg) + MAC_LEN} bytes exceeds {MAX_FRAME}")
    return msg + hmac.digest(key, msg, hashlib.sha256)


def _clamp_u32(value: int) -> int:
    return 0 if value < 0 else (value if value < 0xFFFFFFFF else 0xFFFFFFFE)


def pack_rank(entry: RankEntry) -> bytes:
    """Pack one rank, clamping out-of-range numbers instead of failing (a bad slot must not stop the agent)."""
    e = entry
    return RANK.pack(
        e.rank & 0xFFFFFFFF, e.pid & 0xFFFFFFFF, max(-(2**63), min(e.step, 2**63 - 1)), e.phase & 0xFF,
        e.state & 0xFF, e.rank_flags & 0xFF, e.control_flags & 0xFF,
        e.beat_age_ms if e.beat_age_ms == NO_BEAT else _clamp_u32(e.beat_age_ms),
        _f32(e.ewma_s), _f32(e.min_s), _f32(e.max_s), float(e.loss),
        max(-(2**63), min(e.loss_step, 2**63 - 1)), e.beats & 0xFFFFFFFFFFFFFFFF,
        max(-32768, min(e.exit_code, 32767)), e.exit_signal & 0xFF, (e.rank_flags >> 8) & 0xFF, float(e.cpu_s),
        e.ckpt_ms & 0xFFFFFFFF,
        max(-(2**63), min(e.ckpt_step, 2**63 - 1)), _f32(e.own_s), e.restore_ms & 0xFFFFFFFF,
        e.restores & 0xFFFFFFFF,
    )


F32_MAX = 3.4028234663852886e38


def _f32(value: float) -> float:
    """Clamp a finite value into float32 range (struct would raise on overflow)."""
    if math.isfinite(value) and abs(value) > F32_MAX:
        return math.copysign(F32_MAX, value)
    return float(value)


def encode_summary(key: bytes, *, instance: int, seq: int, wall_ns: int, mono_ns: int, job: str, node: str,
                   ranks: Sequence[RankEntry]) -> bytes:
    if len(ranks) > MAX_RANKS:
        raise ValueError(f"{len(ranks)} ranks on one node exceed the frame limit of {MAX_RANKS}")
    body = b"".join(pack_rank(r) for r in ranks)
    return _seal(key, KIND_SUMMARY, len(ranks), instance, seq, wall_ns, mono_ns, job, node, body)


def encode_control(key: bytes, *, instance: int, seq: int, wall_ns: int, mono_ns: int, job: str, node: str,
                   commands: Sequence[Command]) -> bytes:
    if len(commands) > MAX_COMMANDS:
        raise ValueError(f"{len(commands)} commands exceed {MAX_COMMANDS}")
    body = b"".join(COMMAND.pack(c.command & 0xFF, c.rank & 0xFFFFFFFF, c.arg & 0xFFFFFFFFFFFFFFFF)
                    for c in commands)
    return _seal(key, KIND_CONTROL, len(commands), instance, seq, wall_ns, mono_ns, job, node, body)


def encode_events(key: bytes, *, instance: int, seq: int, wall_ns: int, mono_ns: int, job: str, node: str,
                  events: Sequence[Event]) -> bytes:
    parts = []
    for ev in events:
        text = ev.text.encode("utf-8")[:MAX_TEXT]
        parts.append(EVENT.pack(ev.kind & 0xFF, ev.rank & 0xFFFFFFFF, len(text)) + text)
    return _seal(key, KIND_EVENT, len(events), instance, seq, wall_ns, mono_ns, job, node, b"".join(parts))


def encode_order(key: bytes, *, instance: int, seq: int, wall_ns: int, mono_ns: int, job: str, node: str,
                 text: str) -> bytes:
    body = text.encode("utf-8")
    if len(body) > MAX_ORDER:
        raise ValueError(f"order of {len(body)} bytes exceeds {MAX_ORDER}")
    return _seal(key, KIND_ORDER, 1, instance, seq, wall_ns, mono_ns, job, node, body)


def order_text(frame: Frame) -> str:
    return frame.body.decode("utf-8")  # checked in decode


def decode(key: bytes, data: bytes, job: str | None = None) -> Frame:
    """Authenticate and parse one datagram; raise ``FrameError(reason)`` for anything not exactly right."""
    n = len(data)
    if n > MAX_FRAME:
        raise FrameError("too_long")
    if n < HEADER.size + MAC_LEN:
        raise FrameError("short")
    msg = data[:-MAC_LEN]
    if not hmac.compare_digest(hmac.digest(key, msg, hashlib.sha256), data[-MAC_LEN:]):
        raise FrameError("mac")
    magic, version, kind, count, instance, seq, wall_ns, mono_ns, job_len, node_len = HEADER.unpack_from(msg)
    if magic != MAGIC:
        raise FrameError("magic")
    if version != VERSION and version not in OLD_VERSIONS:
        raise FrameError("version")
    start = HEADER.size + job_len + node_len
    if start > len(msg):
        raise FrameError("length")
    try:
        job_s = msg[HEADER.size:HEADER.size + job_len].decode("utf-8")
        node_s = msg[HEADER.size + job_len:start].decode("utf-8")
    except UnicodeDecodeError:
        raise FrameError("name") from None
    if job is not None and job_s != job:
        raise FrameError("job")
    body = msg[start:]
    if kind == KIND_SUMMARY:
        size = RANK_SIZES[version]
        if len(body) != count * size:
            raise FrameError("length")
        if size != RANK.size:  # an older agent: pad each entry to today's layout (the fields it lacks: 0)
            pad = bytes(RANK.size - size)
            body = b"".join(body[i:i + size] + pad for i in range(0, len(body), size))
    elif kind == KIND_CONTROL:
        if len(body) != count * COMMAND.size:
            raise FrameError("length")
    elif kind == KIND_EVENT:
        _parse_events(body, count)  # validates
    elif kind == KIND_ORDER:
        if count != 1 or len(body) > MAX_ORDER:
            raise FrameError("length")
        try:
            body.decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("text") from None
    else:
        raise FrameError("kind")
    return Frame(kind, count, instance, seq, wall_ns, mono_ns, job_s, node_s, body)


def iter_ranks(body: bytes) -> Iterator[RankEntry]:
    """Decode a summary body lazily (the aggregator keeps bodies as bytes until a snapshot needs them)."""
    return map(_entry, RANK.iter_unpack(body))


def _entry(t: tuple[Any, ...]) -> RankEntry:
    """One unpacked rank: the rank flags' two bytes joined (the high one sits after the exit signal)."""
    return RankEntry._make((*t[:5], t[5] | t[16] << 8, *t[6:16], *t[17:]))


def commands(frame: Frame) -> list[Command]:
    return [Command._make(c) for c in COMMAND.iter_unpack(frame.body)]


def events(frame: Frame) -> list[Event]:
    return _parse_events(frame.body, frame.items)


def _parse_events(body: bytes, count: int) -> list[Event]:
    out, pos = [], 0
    for _ in range(count):
        if pos + EVENT.size > len(body):
            raise FrameError("length")
        kind, rank, length = EVENT.unpack_from(body, pos)
        pos += EVENT.size
        if length > MAX_TEXT or pos + length > len(body):
            raise FrameError("length")
        try:
            text = body[pos:pos + length].decode("utf-8")
        except UnicodeDecodeError:
            raise FrameError("text") from None
        pos += length
        out.append(Event(kind, rank, text))
    if pos != len(body):
        raise FrameError("length")
    return out


# ------------------------------------------------------------------------------------------ health reports
# One node agent's health check travels as one EVENT_HEALTH event (authenticated with the frame): its text is a
# small JSON document, ``{"nvml": status, "findings": [[severity, check, value, threshold, what, fix], ...],
# "more": n}``, fatal findings first, cut to fit ``MAX_TEXT`` (``more`` counts what was left out). Every check is
# sent, clean ones too, so the supervisor sees a node recover and a lost datagram is superseded by the next.
HEALTH_SEVERITIES = ("fatal", "warn")
HEALTH_FIELD_MAX = 400  # characters per text field of a finding
MAX_FINDINGS = 64


class HealthItem(NamedTuple):
    severity: str  # "fatal" or "warn"
    check: str
    value: str
    threshold: str
    what: str
    fix: str


class HealthReport(NamedTuple):
    nvml: str  # "ok", or why there is no GPU reading ("no NVIDIA GPU (...)")
    findings: tuple[HealthItem, ...]
    more: int = 0  # findings left out to fit the event

    @property
    def fatal(self) -> tuple[HealthItem, ...]:
        return tuple(f for f in self.findings if f.severity == "fatal")


def encode_health(nvml: str, findings: Sequence[HealthItem]) -> str:
    """The event text for one check: fatal findings first, as many as fit in ``MAX_TEXT`` bytes."""
    ordered = sorted(findings, key=lambda f: f.severity != "fatal")
    rows = [[str(x)[:HEALTH_FIELD_MAX] for x in f] for f in ordered[:MAX_FINDINGS]]
    status = nvml[:HEALTH_FIELD_MAX]
    while True:
        text = json.dumps({"nvml": status, "findings": rows, "more": len(ordered) - len(rows)},
                          separators=(",", ":"), ensure_ascii=False)
        if len(text.encode("utf-8")) <= MAX_TEXT or not rows:
            return text
        rows.pop()


def parse_health(text: str) -> HealthReport:
    """Parse an EVENT_HEALTH text; ``FrameError("health")`` for anything not exactly the shape above."""
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        raise FrameError("health") from None
    if not isinstance(doc, dict) or set(doc) != {"nvml", "findings", "more"}:
        raise FrameError("health")
    nvml, rows, more = doc["nvml"], doc["findings"], doc["more"]
    if not isinstance(nvml, str) or not isinstance(rows, list) or len(rows) > MAX_FINDINGS:
        raise FrameError("health")
    if type(more) is not int or not 0 <= more <= 1 << 20:
        raise FrameError("health")
    items = []
    for row in rows:
        if not isinstance(row, list) or len(row) != len(HealthItem._fields) or not all(
                isinstance(x, str) and len(x) <= HEALTH_FIELD_MAX for x in row):  # fmt: skip
            raise FrameError("health")
        item = HealthItem(*row)
        if item.severity not in HEALTH_SEVERITIES or not item.check:
            raise FrameError("health")
        items.append(item)
    return HealthReport(nvml[:HEALTH_FIELD_MAX], tuple(items), more)


@dataclass
class _Peer:
    instance: int
    seq: int
    last_sent_ns: int  # the sender's wall clock in its newest accepted frame
    retired: deque[int] = field(default_factory=lambda: deque(maxlen=16))


@dataclass
class ReplayGuard:
    """Refuse replayed or reordered-old frames per sender.

    A sender (agent or supervisor) picks a random 64-bit ``instance`` when it starts and numbers its frames
    1, 2, 3...  Every frame must be fresh (sent within ``window_s`` of our wall clock, which is NTP-synced on
    clusters).  For the current instance only a larger seq passes (the gap is counted as lost frames).  Another
    instance replaces the current one only if it was sent after the current one's newest frame (a restarted
    sender), and the replaced one is retired for good: a recorded frame of an earlier sender instance can
    neither retire the live one (it is older than the live one's frames) nor pass again later.

    ``not_before_ns``: a guard with no history yet (a restarted agent) would take any fresh frame as its
    sender's first, a frame recorded for its predecessor within the window included; frames sent before this
    time (on the sender's own clock: the supervisor passes its wall clock when it starts the agents) are refused.
    """

    window_s: float = 60.0
    peers: dict[str, _Peer] = field(default_factory=dict)
    lost: int = 0
    not_before_ns: int = 0

    def check(self, sender: str, instance: int, seq: int, sent_wall_ns: int, now_wall_ns: int) -> str | None:
        """Return a refusal reason, or None after recording the frame as accepted."""
        if abs(now_wall_ns - sent_wall_ns) > self.window_s * 1e9:
            return "stale"
        if sent_wall_ns < self.not_before_ns:
            return "replay"
        peer = self.peers.get(sender)
        if peer is None:
            self.peers[sender] = _Peer(instance, seq, sent_wall_ns)
            return None
        if peer.instance == instance:
            if seq <= peer.seq:
                return "replay"
            self.lost += seq - peer.seq - 1
            peer.seq, peer.last_sent_ns = seq, max(peer.last_sent_ns, sent_wall_ns)
            return None
        if instance in peer.retired or sent_wall_ns <= peer.last_sent_ns:
            return "replay"
        peer.retired.append(peer.instance)
        peer.instance, peer.seq, peer.last_sent_ns = instance, seq, sent_wall_ns
        return None


def flags_arg(flags: int, at_step: int = 0) -> int:
    """Pack slot control flags (8 bits) and the step to act at (56 bits) into one command argument."""
    return (flags & 0xFF) | (max(0, min(at_step, 2**56 - 1)) << 8)


def split_flags_arg(arg: int) -> tuple[int, int]:
    return arg & 0xFF, arg >> 8

"""Fuzz every parser of untrusted input in the project for N seconds; report inputs tried and escapes per target.

    python bench/fuzz_all.py --seconds 120 [--only manifest,journal] [--seed 1]

An *escape* is any exception other than the parser's own typed error (or, for readers that must never raise,
any exception at all). Inputs are seed documents (real Slurm outputs from tests/unit/fixtures, a real manifest,
journal, config, frame, slot) mutated at the byte level (flips, inserts, cuts, splices) and at the JSON level (a
value replaced by a hostile one: a 5000-digit int, 1e999, 100,000-deep nesting, wrong types). The suite runs the
same contracts with hypothesis on a bounded budget (tests/unit/test_parsers_fuzz.py); this is the long run.
Exit status 1 when any target had an escape.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FIXTURES = REPO / "tests" / "unit" / "fixtures" / "slurm"
HOSTILE_RAW = [
    "1" + "0" * 400, "1" + "0" * 5000, "-" + "9" * 4301, "1e999", "-1e999", "NaN", "Infinity", "-0", "0.0",
    "[" * 100_000, "{\"a\":" * 50_000, "null", "true", "\"\"", "[]", "{}", "\"" + "x" * 70_000 + "\"",
    "\"\\ud800\"", "\"../../etc/passwd\"", "\"/abs\"", "\"a\\u0000b\"", "-1", "4294967296", "18446744073709551616",
]
PLACEHOLDER = "\u0000FUZZ\u0000"


# ----------------------------------------------------------------------------------------------- mutators
def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        op = rng.randrange(7)
        pos = rng.randrange(len(buf) + 1)
        if op == 0 and buf:
            buf[min(pos, len(buf) - 1)] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[pos:pos] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        elif op == 2:
            del buf[pos:pos + rng.randint(1, 64)]
        elif op == 3:
            buf = buf[:pos]
        elif op == 4 and buf:
            start = rng.randrange(len(buf))
            buf[pos:pos] = buf[start:start + rng.randint(1, 256)]
        elif op == 5:
            buf[pos:pos] = rng.choice([b"\r", b"\n", b"\r\n", b"\x00", b"\xff\xfe", b"=", b"|", b"[", b"{"])
        else:
            buf[pos:pos] = rng.choice(HOSTILE_RAW).encode()[:2000]
    return bytes(buf)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:20]):
            out += _paths(v, (*prefix, i))
    return out


def mutate_json(rng: random.Random, doc: Any) -> bytes:
    """Replace one value (at any depth) of a JSON document by a hostile raw JSON text."""
    doc = json.loads(json.dumps(doc))
    paths = _paths(doc)[1:] or [()]
    path = rng.choice(paths)
    if not path:
        return rng.choice(HOSTILE_RAW).encode()
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = PLACEHOLDER
    text = json.dumps(doc).replace(json.dumps(PLACEHOLDER), rng.choice(HOSTILE_RAW), 1)
    return text.encode()


def mutated(rng: random.Random, seeds: list[bytes], docs: list[Any]) -> bytes:
    if docs and rng.random() < 0.5:
        return mutate_json(rng, rng.choice(docs))
    if rng.random() < 0.05:
        return bytes(rng.randrange(256) for _ in range(rng.randint(0, 512)))
    return mutate_bytes(rng, rng.choice(seeds))


# ----------------------------------------------------------------------------------------------- targets
class Target:
    """``max_s``: an input that takes longer is an escape too (a quadratic regex on a printed line is a denial of
    service of the supervisor, not a slow test)."""

    def __init__(self, name: str, seeds: list[bytes], run: Callable[[bytes], Any], allowed: tuple[type, ...],
                 json_seeds: bool = False, max_s: float = 2.0) -> None:
        self.name, self.seeds, self.run, self.allowed, self.max_s = name, seeds, run, allowed, max_s
        self.docs = [json.loads(s) for s in seeds] if json_seeds else []
        self.tried = self.escapes = self.slow = 0
        self.first: str = ""


def _fixture_texts(pattern: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted(FIXTURES.glob(pattern))] or [b"{}"]


def _manifest_seed(tmp: Path) -> bytes:
    from supervisor.checkpoint import trust
    from supervisor.checkpoint.manifest import FileEntry, Manifest

    m = Manifest(step=100, time=1796208974.44, world_size=2, hash_algorithm="crc32",
                 files=(FileEntry(".metadata", 3, "0e9d89a6"), FileEntry("__0_0.distcp", 5, "c1932b13")),
                 env={"python": "3.11", "argv": ["train.py"]}, extra={"epoch": 3})
    key = trust.manifest_key(b"s" * 32)
    m = Manifest(**{**m.__dict__, "auth": trust.make_auth(key, m.to_doc(), {".metadata": "00" * 32})})
    return m.to_json()


def build_targets(tmp: Path) -> list[Target]:
    from slurm import parse, parse_sacct, parse_scontrol, sbatch
    from supervisor import config, journal
    from supervisor.checkpoint import single_file, trust
    from supervisor.checkpoint.locate import checkpoint_dir_from_argv
    from supervisor.checkpoint.manifest import MANIFEST_NAME, ManifestError, parse_manifest
    from supervisor.checkpoint.validate import validate_checkpoint
    from supervisor.client import slot
    from supervisor.errors import ConfigError
    from supervisor.heartbeat import wire

    targets: list[Target] = []
    manifest = _manifest_seed(tmp)
    targets.append(Target("manifest", [manifest], parse_manifest, (ManifestError,), json_seeds=True))

    ckpt = tmp / "step_000000100"
    ckpt.mkdir()
    (ckpt / ".metadata").write_bytes(b"abc")
    (ckpt / "__0_0.distcp").write_bytes(b"12345")
    key = trust.manifest_key(b"s" * 32)

    def validate(data: bytes) -> Any:
        (ckpt / MANIFEST_NAME).write_bytes(data)
        return validate_checkpoint(ckpt, full=True, key=key)  # must never raise: a bad checkpoint is a status

    targets.append(Target("checkpoint-validate", [manifest], validate, (), json_seeds=True))

    lines = [journal.encode({"type": "campaign_started", "root": "/c", "command": ["python", "t.py"]}, 1.0),
             journal.encode({"type": "attempt_started", "job_id": "12", "nodes": ["n1", "n2"]}, 2.0),
             journal.encode({"type": "checkpoint_committed", "step": 10, "path": "/ck/step_10"}, 3.0)]
    targets.append(Target("journal", [b"".join(lines), lines[0] + lines[1][:20]], journal.parse,
                          (journal.JournalError,)))

    cfg_doc = {"submit": {"signal_lead_s": 120, "job_name": "x"}, "run": {"checkpoint_dir": "/c", "spare_nodes": 1,
               "agent_interval_s": 0.25, "srun_args": ["--cpu-bind=none"]}, "detect": {"node_silence_s": 10.0},
               "policy": {"stop_grace_s": 120.0, "budgets": {"hang": 3}}, "ledger": {"weights": {"hang": 0.5}},
               "alerts": {"command": ["true"]}, "log_signatures": {"XID 79": "hardware"}}
    cfg_file = tmp / "c.toml"

    def config_json(data: bytes) -> Any:
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return None  # not a document: the mapping path needs one
        return config.from_mapping(doc)

    def config_toml(data: bytes) -> Any:
        cfg_file.write_bytes(data)
        return config.load(cfg_file)

    toml_seed = (b'[submit]\nsignal_lead_s = 120\njob_name = "x"\n[run]\ncheckpoint_dir = "/c"\nspare_nodes = 1\n'
                 b'agent_interval_s = 0.25\n[policy]\nstop_grace_s = 120.0\n[policy.budgets]\nhang = 3\n'
                 b'[ledger.weights]\nhang = 0.5\n[log_signatures]\n"XID 79" = "hardware"\n')
    targets.append(Target("config-mapping", [json.dumps(cfg_doc).encode()], config_json, (ConfigError,),
                          json_seeds=True))
    targets.append(Target("config-toml", [toml_seed], config_toml, (ConfigError,)))

    def text_of(fn: Callable[[str], Any]) -> Callable[[bytes], Any]:
        return lambda data: fn(data.decode("utf-8", errors="replace"))

    err = (parse.ParseError,)
    targets += [
        Target("squeue-json", _fixture_texts("*/squeue*.json"), text_of(parse.parse_squeue_json), err, True),
        Target("nodes-json", _fixture_texts("*/sinfo*.json") + _fixture_texts("*/scontrol_show_node.json"),
               text_of(parse.parse_nodes_json), err, True),
        Target("sacct-json", _fixture_texts("*/sacct*.json"), text_of(parse_sacct.parse_sacct_json), err, True),
        Target("scontrol-jobs", _fixture_texts("22.05/scontrol_[!n]*.txt"), text_of(parse_scontrol.parse_scontrol_jobs), err),
        Target("scontrol-nodes", _fixture_texts("22.05/scontrol_nodes*.txt"), text_of(parse_scontrol.parse_scontrol_nodes),
               err),
        Target("sacct-text", _fixture_texts("22.05/sacct_runs.txt"), text_of(parse_sacct.parse_sacct_text), err),
    ]

    def directive(data: bytes) -> Any:
        value = data.decode("utf-8", errors="replace")
        script = sbatch.render_script([f"--job-name={value}", f"--comment={value}"], [["true"]])
        if script.count("\n") != 4:  # the contract itself: each directive stays one line
            raise AssertionError(f"a directive spilled into the script: {script!r}")
        return script

    targets.append(Target("sbatch-directive", [b"supervise", b"llama-7b"], directive, (sbatch.SbatchFlagError,)))
    targets.append(Target("argv-checkpoint-dir", [b"python\0t.py\0--ckpt-dir\0/c\0ckpt_path=/x/last.ckpt"],
                          lambda d: checkpoint_dir_from_argv(d.decode("utf-8", "replace").split("\0")), ()))

    import io
    import pickle
    import zipfile

    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w", compression=zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle.dumps({"epoch": 1, "global_step": 20, "state_dict": {}}, protocol=2))
        zf.writestr("archive/data/0", b"\0" * 64)
    single = tmp / "last.ckpt"

    def single_check(data: bytes) -> Any:
        single.write_bytes(data)
        try:
            return single_file.check_file(single, full=True)
        finally:
            single_file.global_step_in_pickle(data)  # never raises

    targets.append(Target("single-file-checkpoint", [zbuf.getvalue(), pickle.dumps({"a": 1}, protocol=2)],
                          single_check, (single_file.FormatError,)))

    wkey = wire.derive_key(b"k" * 32)
    now = time.time_ns()
    ranks = [wire.RankEntry(r, 100 + r, 5, 1, 1, 0, 0, 10, 0.1, 0.1, 0.2, 1.5, 5, 9, -1, 0, 1.0) for r in range(3)]
    frames = [wire.encode_summary(wkey, instance=1, seq=2, wall_ns=now, mono_ns=now, job="12", node="n1", ranks=ranks),
              wire.encode_control(wkey, instance=1, seq=3, wall_ns=now, mono_ns=now, job="12", node="n1",
                                  commands=[wire.Command(wire.CMD_EXIT)]),
              wire.encode_events(wkey, instance=1, seq=4, wall_ns=now, mono_ns=now, job="12", node="n1",
                                 events=[wire.Event(1, 0, "/stacks/x")])]

    def frame_any(data: bytes) -> Any:
        return _use_frame(wire, wire.decode(wkey, data, "12"))

    def frame_signed(data: bytes) -> Any:
        # Re-seal the mutated message with the real key: fuzzes the parser behind the MAC (a key holder's bugs).
        import hashlib
        import hmac

        msg = data[:-wire.MAC_LEN] if len(data) > wire.MAC_LEN else data
        return _use_frame(wire, wire.decode(wkey, msg + hmac.digest(wkey, msg, hashlib.sha256), None))

    health_seed = wire.encode_health("ok", [wire.HealthItem("fatal", "xid", "79", "hardware Xid", "GPU 0 fell off", "reset")])
    targets.append(Target("wire-health", [health_seed.encode()], text_of(wire.parse_health), (wire.FrameError,), True))
    targets.append(Target("wire-frame", frames, frame_any, (wire.FrameError,)))
    targets.append(Target("wire-frame-signed", frames, frame_signed, (wire.FrameError,)))

    seed_buf = mmap.mmap(-1, slot.SLOT_SIZE)
    writer = slot.SlotWriter(seed_buf, pid=os.getpid(), rank=0, local_rank=0, world_size=1)
    writer.enable_waits()  # the wait ring in the seed: the own-time derivation is fuzzed too
    for i in range(3):
        writer.add_wait(1000 * i)
        writer.beat(i, 1.0)
    seed_slot = bytes(seed_buf[:slot.SLOT_SIZE])

    def slot_read(data: bytes) -> Any:
        buf = mmap.mmap(-1, max(1, len(data)))
        buf.write(data)
        try:
            return slot.read_slot(buf, allow_torn=True), slot.read_slot(buf)
        finally:
            buf.close()

    def slot_keep_header(data: bytes) -> bytes:
        return seed_slot[:16] + data[16:slot.SLOT_SIZE]

    targets.append(Target("slot-record", [seed_slot], lambda d: slot_read(slot_keep_header(d)), ()))
    targets += _untrusted_text_targets(tmp)
    return targets


GOLDEN_JOURNAL = REPO / "tests" / "golden" / "demo-journal.jsonl"
LOG_SEED = (b"0: step=40 loss=0.5\n1: [rank1]:[E gloo] Connection closed by peer [127.0.0.1]:29500\n"
            b"srun: error: node2: task 1: Killed\nsrun: error: Task launch for StepId=7.0 failed on node node2: "
            b"Communication connection failure\n0: RuntimeError: CUDA error: device-side assert triggered\n"
            b"slurmstepd: error: *** STEP 7.0 ON node1 CANCELLED AT 2026-12-04T10:00:00 DUE TO TIME LIMIT ***\n"
            b"0: torch.distributed.DistBackendError: c10d timed out\n1: NCCL WARN remote process exit\n"
            b"srun: error: node1: tasks 0-3: Exited with exit code 1\n1: job requeued due to failure of node node[2-3]\n")


STACK_SEEDS = [p.read_bytes() for p in sorted((Path(__file__).resolve().parents[1] / "tests" / "fixtures" /
                                               "stacks").glob("rank*.txt"))]  # fmt: skip

FLIGHT_SEEDS = [p.read_bytes() for p in sorted((Path(__file__).resolve().parents[1] / "tests" / "fixtures" /
                                                "flight_recorder").glob("rank_*"))]  # fmt: skip


def _untrusted_text_targets(tmp: Path) -> list[Target]:
    """Issue 22: the journal's folds and everything that renders them, the CLI's readers of private files, the
    program's printed text (the log signatures, srun's task lines, hostlists named in them), adopted scripts."""
    from slurm import hostlist, parse_config
    from slurm.errors import HostlistError
    from supervisor import batchscript, campaign, journal, report_view, stop_request
    from supervisor.commands import status
    from supervisor.decisions import campaign_state
    from supervisor.decisions.classify import Evidence, LogLine, classify
    from supervisor.decisions.flight_recorder import FlightRecorderError
    from supervisor.decisions.tasklog import srun_task_exits, torchrun_worker_exits
    from supervisor.errors import CampaignError, UsageError
    from supervisor.plot.timeline import TimelineView

    def fold(data: bytes) -> Any:
        events = journal.parse(data).events
        view = TimelineView()
        state = campaign_state.fold(events, views=(view,))
        doc = state.report(2e9)
        report_view.render_text(doc)
        view.timeline(2e9, doc["goodput"])
        state.interval.measured(2e9)
        return state.ledger.table(2e9)

    def live(data: bytes) -> Any:
        (tmp / "live.json").write_bytes(data)
        doc = status.load_live(tmp)
        doc["summary"] = status.campaign_summary(tmp)
        status.summary_line(doc["summary"])
        return status.render_table(doc)

    spec_dir = tmp / "spec-campaign"
    campaign.create(spec_dir, campaign.CampaignSpec(command=("python", "t.py"), config={"run": {}}), "#!/bin/sh\n")
    spec_seed = (spec_dir / "campaign.json").read_bytes()

    def spec(data: bytes) -> Any:
        (spec_dir / "campaign.json").write_bytes(data)
        return campaign.load(spec_dir)

    def stop(data: bytes) -> Any:
        stop_request.path(tmp).write_bytes(data)
        return stop_request.read(tmp)

    def logs(data: bytes) -> Any:
        lines = data.decode("utf-8", errors="replace").split("\n")[-400:]
        evidence = Evidence(log_lines=tuple(LogLine(x) for x in lines), allocation_nodes=("node1", "node2"),
                            job_nodes=("node1", "node2", "node3"), task_nodes=("node1", "node1", "node2", "node2"))
        srun_task_exits(lines)
        torchrun_worker_exits(lines)
        return classify(evidence)

    def log_digest(data: bytes) -> Any:  # the launch log's digest, fed in two pieces split mid-line
        from supervisor.decisions.log_digest import LogDigest

        d = LogDigest(tasks=4)
        d.feed(data[: len(data) // 2])
        d.feed(data[len(data) // 2 :])
        d.finish()
        return logs("\n".join(text for _, text in d.lines()).encode())

    def flight_dump(data: bytes) -> Any:  # a rank's flight-recorder dump (JSON or pickle), as the ending reads it
        from supervisor.decisions import flight_recorder

        dump = flight_recorder.parse_dump(data)
        return flight_recorder.lagging({0: dump, 1: dump, 2: flight_recorder.Dump({})})

    def stack_dump(data: bytes) -> Any:  # a rank's stack dump, as the stall probe reads it
        from supervisor.decisions import stall

        stack = stall.parse(data.decode("utf-8", errors="replace"))
        return stall.odd_ranks([0], {0: stack, 1: stack})

    def text_of(fn: Callable[[str], Any]) -> Callable[[bytes], Any]:
        return lambda data: fn(data.decode("utf-8", errors="replace"))

    live_seed = json.dumps({"job": "7", "ranks": [{"rank": 0, "node": "n1", "pid": 1, "step": 5, "phase": "step",
                                                   "state": "running", "steps_per_s": 2.0, "beat_age_s": 0.1}],
                            "nodes": [{"node": "n1", "staleness_s": 0.4}], "counters": {"rejected_mac": 1}}).encode()
    script_seed = b"#!/bin/bash\n#SBATCH -N 2\n#SBATCH --time=10\nmodule load x\nsrun --cpu-bind=none python t.py\n"
    return [
        Target("journal-fold", [GOLDEN_JOURNAL.read_bytes()], fold, (journal.JournalError,)),
        Target("cli-live", [live_seed], live, (CampaignError,), json_seeds=True),
        Target("cli-campaign-spec", [spec_seed], spec, (CampaignError,), json_seeds=True),
        Target("cli-stop-request", [b'{"checkpoint": true, "t": 1.5}'], stop, (), json_seeds=True),
        Target("hostlist", [b"node[01-03,7],r[1-2]n[01-02]", b"gpu-a[1-2]-x"], text_of(hostlist.expand),
               (HostlistError,), max_s=0.5),
        Target("log-signatures", [LOG_SEED], logs, (), max_s=1.0),
        Target("log-digest", [LOG_SEED], log_digest, (), max_s=1.0),
        Target("stall-stacks", STACK_SEEDS, stack_dump, (), max_s=1.0),
        Target("flight-recorder", FLIGHT_SEEDS, flight_dump, (FlightRecorderError,), max_s=1.0),
        Target("batchscript", [script_seed], text_of(batchscript.parse), (UsageError,)),
        Target("slurm-durations", [b"5 sec", b"1-00:00:30", b"UNLIMITED"], text_of(parse_config.seconds), ()),
    ]


def _use_frame(wire: Any, frame: Any) -> Any:
    """Decoding an accepted frame's body (what the aggregator and agents do next) must not raise either."""
    if frame.kind == wire.KIND_SUMMARY:
        return list(wire.iter_ranks(frame.body))
    if frame.kind == wire.KIND_CONTROL:
        return [(c.command, c.rank, c.arg) for c in wire.commands(frame)]
    return wire.events(frame)


# ----------------------------------------------------------------------------------------------- driver
def fuzz(targets: list[Target], seconds: float, seed: int, inputs: int = 1 << 62) -> None:
    """Each target until its share of ``seconds`` is spent or it tried ``inputs`` inputs."""
    rng = random.Random(seed)
    per_target = seconds / len(targets)
    for target in targets:
        deadline = time.monotonic() + per_target
        while time.monotonic() < deadline and target.tried < inputs:
            data = mutated(rng, target.seeds, target.docs)
            target.tried += 1
            started = time.process_time()
            try:
                target.run(data)
            except target.allowed:
                pass
            except Exception:  # noqa: BLE001 - this is what we are counting
                target.escapes += 1
                if not target.first:
                    target.first = f"{data[:120]!r}: {traceback.format_exc(limit=3).strip().splitlines()[-1]}"
            took = time.process_time() - started
            if took > target.max_s:
                target.escapes += 1
                target.slow += 1
                if not target.first:
                    target.first = f"{data[:120]!r}: took {took:.2f} s of CPU (limit {target.max_s:g} s)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=30.0, help="total time, shared equally by the targets")
    p.add_argument("--only", default="", help="comma-separated target names")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--inputs", type=int, default=1 << 62, help="stop a target after this many inputs")
    args = p.parse_args(argv)
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    warnings.simplefilter("ignore")  # fuzzed [log_signatures] regexes make re warn about nested sets
    with tempfile.TemporaryDirectory() as tmp:
        targets = build_targets(Path(tmp))
        if args.only:
            wanted = set(args.only.split(","))
            targets = [t for t in targets if t.name in wanted]
        fuzz(targets, args.seconds, args.seed, args.inputs)
    width = max(len(t.name) for t in targets)
    print(f"{'target'.ljust(width)}  {'inputs':>9}  {'escapes':>7}  {'slow':>4}")
    for t in targets:
        print(f"{t.name.ljust(width)}  {t.tried:>9}  {t.escapes:>7}  {t.slow:>4}" +
              (f"  first: {t.first}" if t.first else ""))
    total = sum(t.tried for t in targets)
    escapes = sum(t.escapes for t in targets)
    print(f"{'total'.ljust(width)}  {total:>9}  {escapes:>7}  ({args.seconds:.0f} s, seed {args.seed})")
    return 1 if escapes else 0


if __name__ == "__main__":
    sys.exit(main())

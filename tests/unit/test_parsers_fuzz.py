"""Only typed errors escape the parsers of untrusted input (issue 10, finding 3): regressions and fuzzing.

Hypothesis runs derandomized with a bounded number of examples so the suite stays fast; `bench/fuzz_all.py
--seconds N` is the long run over the same contracts (and the heartbeat channel's parsers).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm import parse, parse_sacct, parse_scontrol
from supervisor import config, journal
from supervisor.checkpoint.manifest import MANIFEST_NAME, FileEntry, Manifest, ManifestError, parse_manifest
from supervisor.checkpoint.store import CheckpointStore, checkpoint_name
from supervisor.errors import ConfigError

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
FUZZ = settings(max_examples=250, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

HOSTILE = ["1" + "0" * 400, "1" + "0" * 5000, "1e999", "NaN", "-Infinity", "[" * 50_000, '{"a":' * 30_000,
           "null", "true", '""', "[]", "{}", "-1", "18446744073709551616", '"\\ud800"']
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def _manifest_doc() -> dict:
    m = Manifest(step=100, time=1.5, world_size=2, hash_algorithm="crc32",
                 files=(FileEntry(".metadata", 3, "ab"), FileEntry("__0_0.distcp", 5, "cd")))
    return json.loads(m.to_json())


def _with_raw(doc: dict, key: str, raw: str) -> bytes:
    doc = dict(doc)
    doc[key] = "\x00X\x00"
    return json.dumps(doc).replace(json.dumps("\x00X\x00"), raw, 1).encode()


# -- manifests -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("key", ["time", "step", "world_size", "files", "env", "extra", "auth"])
@pytest.mark.parametrize("raw", HOSTILE)
def test_hostile_manifest_values_raise_only_manifest_error(key, raw):
    try:
        parse_manifest(_with_raw(_manifest_doc(), key, raw))
    except ManifestError:
        pass


@FUZZ
@given(key=st.sampled_from(sorted(_manifest_doc())), value=json_values)
def test_any_value_anywhere_in_a_manifest_raises_only_manifest_error(key, value):
    doc = _manifest_doc()
    doc[key] = value
    try:
        parse_manifest(json.dumps(doc).encode())
    except ManifestError:
        pass


@FUZZ
@given(st.binary(max_size=400))
def test_manifest_bytes_raise_only_manifest_error(data):
    try:
        parse_manifest(data)
    except ManifestError:
        pass


def test_an_unreadable_newest_manifest_is_quarantined_and_the_previous_checkpoint_chosen(tmp_path):
    for step in (10, 20):
        d = tmp_path / checkpoint_name(step)
        d.mkdir()
        (d / "__0_0.distcp").write_bytes(b"x")
        m = Manifest(step=step, time=1.0, world_size=1, hash_algorithm="crc32",
                     files=(FileEntry("__0_0.distcp", 1, "8cdc1683"),))
        (d / MANIFEST_NAME).write_bytes(m.to_json())
    (tmp_path / checkpoint_name(20) / MANIFEST_NAME).write_bytes(_with_raw(_manifest_doc(), "time", "1" + "0" * 400))
    store = CheckpointStore(tmp_path)
    best = store.newest_valid()
    assert best is not None and best.step == 10
    assert [q.path.name.split("-")[0] for q in store.quarantined()] == [checkpoint_name(20)]


# -- journal -------------------------------------------------------------------------------------------
def _journal_bytes() -> bytes:
    return b"".join(journal.encode({"type": t, "n": i}, float(i)) for i, t in enumerate(["a", "b", "c"]))


@pytest.mark.parametrize("raw", HOSTILE)
def test_a_hostile_journal_line_raises_only_journal_errors(raw):
    for data in (_journal_bytes() + raw.encode() + b"\n" + _journal_bytes(), _journal_bytes() + raw.encode()):
        try:
            journal.parse(data)
        except journal.JournalError:
            pass


@FUZZ
@given(st.binary(max_size=300), st.integers(0, 200))
def test_journal_bytes_raise_only_journal_errors(junk, cut):
    data = _journal_bytes()
    try:
        journal.parse(data[:cut] + junk + data[cut:])
    except journal.JournalError:
        pass


def test_deep_nesting_in_the_torn_tail_is_tolerated():
    assert len(journal.parse(_journal_bytes() + b"[" * 100_000).events) == 3


@pytest.mark.parametrize("tail", [b'{"v":1,"type":"x"}\r{"v":1,"ty', b"\r", b'{"v":1,"type":"x","t":1}\r\r{"v"'])
def test_reseal_and_reader_agree_on_line_ends(tmp_path, tail):
    """A torn tail holding a carriage return: the writer seals it, appends, and the journal reads cleanly."""
    path = tmp_path / "journal.jsonl"
    path.write_bytes(_journal_bytes() + tail)
    with journal.Journal(path) as j:
        j.append({"type": "after"})
    types = [e["type"] for e in journal.read(path)]
    assert types[:3] == ["a", "b", "c"] and types[-1] == "after"


# -- config --------------------------------------------------------------------------------------------
SECTIONS = {"submit": ["signal_lead_s", "job_name"], "run": ["checkpoint_dir", "spare_nodes", "agent_interval_s",
            "summary_interval_s", "loop_interval_s", "checkpoint_grace_s", "srun_args", "adopt_foreign_checkpoints"],
            "detect": ["node_silence_s", "step_k", "quantile"], "policy": ["stop_grace_s", "budgets", "tiers"],
            "ledger": ["weights", "half_life_s"], "alerts": ["command", "webhook_url"], "log_signatures": ["x"]}


@FUZZ
@given(st.sampled_from(sorted(SECTIONS)).flatmap(lambda s: st.tuples(st.just(s), st.sampled_from(SECTIONS[s]))),
       json_values)
def test_any_config_value_is_accepted_or_a_config_error(where, value):
    section, key = where
    try:
        config.from_mapping({section: {key: value}})
    except ConfigError:
        pass


@FUZZ
@given(st.binary(max_size=200))
def test_config_file_bytes_are_accepted_or_a_config_error(tmp_path, data):
    path = tmp_path / "c.toml"
    path.write_bytes(b"[run]\n" + data)
    try:
        config.load(path)
    except ConfigError:
        pass


# -- Slurm command output --------------------------------------------------------------------------------
def _fixtures(pattern: str) -> list[str]:
    return [p.read_text() for p in sorted(FIXTURES.glob(pattern))]


PARSERS = [
    (parse.parse_squeue_json, _fixtures("*/squeue*.json")),
    (parse.parse_nodes_json, _fixtures("*/sinfo*.json")),
    (parse_sacct.parse_sacct_json, _fixtures("*/sacct*.json")),
    (parse_scontrol.parse_scontrol_jobs, _fixtures("22.05/scontrol_[!n]*.txt")),
    (parse_scontrol.parse_scontrol_nodes, _fixtures("22.05/scontrol_nodes*.txt")),
    (parse_sacct.parse_sacct_text, _fixtures("22.05/sacct_runs.txt")),
]


@FUZZ
@given(which=st.integers(0, len(PARSERS) - 1), seed=st.integers(0, 50), at=st.integers(0, 10_000),
       junk=st.text(max_size=40) | st.sampled_from(HOSTILE), cut=st.booleans())
def test_slurm_output_parsers_raise_only_parse_error(which, seed, at, junk, cut):
    fn, seeds = PARSERS[which]
    text = seeds[seed % len(seeds)]
    at %= len(text) + 1
    text = text[:at] + junk + ("" if cut else text[at:])
    try:
        fn(text)
    except parse.ParseError:
        pass


@pytest.mark.parametrize("doc", [
    '{"jobs": [{"job_id": 1, "nodes": "n[1-99999999]"}]}', '{"jobs": [{"job_id": "1;rm", "nodes": []}]}',
    '{"jobs": [' * 40_000, '{"jobs": [{"job_id": {"set": true, "number": "x"}, "job_state": 5}]}',
    '{"sinfo": [{"node": {"state": 3}, "nodes": {"nodes": 5}}]}', '{"nodes": [{"name": "a b"}]}',
])
def test_odd_json_documents_are_parse_errors(doc):
    for fn in (parse.parse_squeue_json, parse.parse_nodes_json, parse_sacct.parse_sacct_json):
        try:
            fn(doc)
        except parse.ParseError:
            pass


def test_fuzz_bench_runs_every_target_briefly(tmp_path):
    """bench/fuzz_all.py itself: every target builds and runs (a short run; the long one is in docs/security.md)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(repo / "bench" / "fuzz_all.py"), "--seconds", "3"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(repo)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert "wire-frame-signed" in out.stdout and "slot-record" in out.stdout and "manifest" in out.stdout
    for target in ("journal-fold", "cli-live", "cli-campaign-spec", "cli-stop-request", "hostlist", "log-signatures",
                   "batchscript", "slurm-durations"):  # issue 22's surfaces  # fmt: skip
        assert target in out.stdout, target

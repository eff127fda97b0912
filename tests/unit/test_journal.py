"""The campaign journal: durable appends, torn tails tolerated, corruption never silently dropped."""

from __future__ import annotations

import json
import os
import stat

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor import journal
from supervisor.decisions import events as ev
from supervisor.journal import Journal, JournalCorrupt, JournalLocked, JournalTooNew

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
_event = st.fixed_dictionaries({"type": st.sampled_from(ev.EVENT_TYPES), "x": st.integers() | _text})


def _write(path, events):
    with Journal(path, clock=lambda: 100.0) as j:
        for e in events:
            j.append(e)


def test_append_then_read_round_trips_with_version_and_time(tmp_path):
    path = tmp_path / "journal.jsonl"
    _write(path, [ev.campaign_started(5.0, "c", ["python", "train.py"]), {"type": "action", "kind": "alert"}])
    events = journal.read(path)
    assert [e["type"] for e in events] == ["campaign_started", "action"]
    assert events[0]["t"] == 5.0 and events[1]["t"] == 100.0  # event time kept, clock fills a missing one
    assert all(e["v"] == journal.SCHEMA_VERSION for e in events)
    assert events[0]["command"] == ["python", "train.py"]


def test_journal_file_is_private(tmp_path):
    path = tmp_path / "journal.jsonl"
    old = os.umask(0)
    try:
        _write(path, [{"type": "action"}])
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_nan_evidence_is_kept_as_text_not_invalid_json(tmp_path):
    path = tmp_path / "journal.jsonl"
    _write(path, [{"type": "detection", "kind": "nonfinite_loss", "value": float("nan")}])
    line = path.read_bytes().decode()
    json.loads(line)  # strict JSON
    assert journal.read(path)[0]["value"] == "nan"


@settings(max_examples=60, deadline=None)
@given(events=st.lists(_event, min_size=1, max_size=8), cut=st.integers(min_value=1))
def test_torn_last_line_is_ignored_and_reported(tmp_path_factory, events, cut):
    path = tmp_path_factory.mktemp("j") / "journal.jsonl"
    _write(path, events)
    data = path.read_bytes()
    last_start = data.rstrip(b"\n").rfind(b"\n") + 1
    cut_at = last_start + 1 + cut % (len(data) - 2 - last_start)  # strictly inside the last line's JSON
    path.write_bytes(data[:cut_at])
    contents = journal.load(path)
    assert contents.torn_tail
    assert [e["x"] for e in contents.events] == [e["x"] for e in events[:-1]]


def test_corruption_in_the_middle_is_an_error_naming_the_line(tmp_path):
    path = tmp_path / "journal.jsonl"
    _write(path, [{"type": "action", "n": i} for i in range(3)])
    lines = path.read_bytes().split(b"\n")
    lines[1] = b'{"v":1,"type":"act'
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(JournalCorrupt) as info:
        journal.read(path)
    assert "line 2" in info.value.one_line() and "fix:" in info.value.one_line()


def test_reopening_after_a_crash_seals_the_torn_line_without_rewriting(tmp_path):
    path = tmp_path / "journal.jsonl"
    _write(path, [{"type": "action", "n": 1}])
    with open(path, "ab") as f:
        f.write(b'{"v":1,"t":3.0,"type":"acti')  # the crash
    before = path.read_bytes()
    _write(path, [{"type": "action", "n": 2}])
    assert path.read_bytes().startswith(before)  # nothing rewritten or truncated
    contents = journal.load(path)
    assert [e["n"] for e in contents.events] == [1, 2]
    assert contents.sealed_fragments == (before.index(b'{"v":1,"t":3.0,"type":"acti'),)
    assert not contents.torn_tail


def test_newer_schema_is_a_clear_error(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"v": 99, "t": 1.0, "type": "campaign_started"}\n')
    with pytest.raises(JournalTooNew, match="schema version 99"):
        journal.read(path)


def test_unknown_fields_and_types_are_passed_through(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"v": 1, "t": 1.0, "type": "future_thing", "new_field": [1]}\n')
    assert journal.read(path) == [{"v": 1, "t": 1.0, "type": "future_thing", "new_field": [1]}]


def test_a_second_writer_is_refused(tmp_path):
    path = tmp_path / "journal.jsonl"
    with Journal(path):
        with pytest.raises(JournalLocked):
            Journal(path)
    Journal(path).close()  # released on close


def test_missing_journal_names_the_path(tmp_path):
    with pytest.raises(journal.JournalError, match="no journal at"):
        journal.read(tmp_path / "nope.jsonl")


def test_event_without_type_is_rejected_before_writing(tmp_path):
    path = tmp_path / "journal.jsonl"
    with Journal(path) as j, pytest.raises(ValueError, match="type"):
        j.append({"kind": "x"})
    assert path.read_bytes() == b""


def test_a_lost_final_newline_loses_no_event(tmp_path):
    path = tmp_path / "journal.jsonl"
    _write(path, [{"type": "action", "n": 1}])
    path.write_bytes(path.read_bytes().rstrip(b"\n"))
    assert [e["n"] for e in journal.read(path)] == [1]
    _write(path, [{"type": "action", "n": 2}])
    contents = journal.load(path)
    assert [e["n"] for e in contents.events] == [1, 2] and contents.sealed_fragments == ()

"""Naming the rank a stall waits for from real stacks (tests/fixtures/stacks, captured from a 3-rank gloo DDP job
whose rank 1 hung after its step: capture.py), and the parser's robustness on any text."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import stall

FIXTURES = Path(__file__).parents[1] / "fixtures" / "stacks"


def dump(rank: int, kind: str) -> stall.Stack:
    return stall.parse((FIXTURES / f"rank{rank}.{kind}.txt").read_text())


KINDS = ("faulthandler", "pyspy", "pyspy-native")


def test_the_peers_wait_inside_ddps_backward_and_the_hung_rank_does_not():
    for kind in KINDS:
        assert isinstance(stall.waiting_place(dump(0, kind)), stall.Frame), kind
        assert isinstance(stall.waiting_place(dump(2, kind)), stall.Frame), kind
        assert stall.waiting_place(dump(1, kind)) is False, kind


def test_the_hung_rank_is_named_from_either_dump_format():
    for kind in KINDS:
        got = stall.odd_ranks([0, 1, 2], {r: dump(r, kind) for r in range(3)})
        assert got.named == (1,), kind
        assert got.evidence[0].startswith("rank 1 is not waiting for its peers: its stack is at ")
        assert ("clock_nanosleep" if kind == "pyspy-native" else "rank_main (") in got.evidence[0]
        assert "rank(s) 0, 2 wait for peers" in got.evidence[-1]


def test_formats_mix_and_only_candidates_are_named():
    stacks = {0: dump(0, "pyspy-native"), 1: dump(1, "faulthandler"), 2: dump(2, "pyspy")}
    assert stall.odd_ranks([1], stacks).named == (1,)
    assert stall.odd_ranks([0, 2], stacks).named == ()  # the candidates wait: nobody stands out


def test_nobody_is_named_on_incomplete_or_ambiguous_evidence():
    full = {r: dump(r, "faulthandler") for r in range(3)}
    assert stall.odd_ranks([0, 1, 2], {**full, 1: None}).named == ()  # the odd one's stack is missing
    assert stall.odd_ranks([0, 1, 2], {**full, 1: stall.parse("garbage")}).named == ()  # unreadable
    assert stall.odd_ranks([1], {1: full[1]}).named == ()  # no peer seen waiting
    two_out = {0: full[0], 1: full[1], 2: full[1], 3: full[1]}
    assert stall.odd_ranks([0, 1, 2, 3], two_out).named == ()  # most ranks outside a collective: not one odd rank
    assert stall.odd_ranks([0, 1, 2], {r: full[0] for r in range(3)}).named == ()  # everyone waits


def test_a_thread_started_by_threading_is_not_the_main_thread():
    text = (
        'Thread 0x00007f2740d0b6c0 (most recent call first):\n'
        '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4159 in barrier\n'
        '  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap\n\n'
        'Current thread 0x00007f2741a4cb80 (most recent call first):\n'
        '  File "/w/train.py", line 7 in load_batch\n'
        '  File "/w/train.py", line 9 in <module>\n'
    )  # fmt: skip
    stack = stall.parse(text)
    assert len(stack.threads) == 2 and stack.main is not None
    assert stall.waiting_place(stack) is False and stall.where(stack) == "load_batch (/w/train.py:7)"


def test_a_collective_in_torch_distributed_is_waiting():
    text = 'Thread 9 (idle): "MainThread"\n    barrier (torch/distributed/distributed_c10d.py:4159)\n    main (t.py:3)\n'
    place = stall.waiting_place(stall.parse(text))
    assert isinstance(place, stall.Frame) and place.func == "barrier"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=3000) | st.lists(st.sampled_from([
    "Thread 0x1 (most recent call first):", '  File "a", line 1 in f', 'Thread 2 (idle): "MainThread"',
    "    f (a.py:1)", "    g (lib.so)", "", "Current thread 0x2 (most recent call first):", "x" * 600,
]), max_size=60).map("\n".join))  # fmt: skip
def test_the_parser_never_raises_and_stays_bounded(text):
    stack = stall.parse(text)
    assert len(stack.threads) <= stall.MAX_THREADS
    assert all(len(t.frames) <= stall.MAX_FRAMES for t in stack.threads)
    stall.waiting_place(stack)
    stall.where(stack)
    stall.odd_ranks([0], {0: stack, 1: stack})

"""The watch's triage (decisions/triage.py): which detections end a launch's watch, and when. Pure; the rules the
watch used to keep inline, each tested alone, and a property over any sequence of passes."""

from __future__ import annotations

from fakes import rank_view
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.decisions import triage
from supervisor.decisions.detect.findings import (
    FAULT_KINDS,
    HANG_KINDS,
    LOSS_SPIKE,
    NODE_SILENT,
    RANK_EXITED,
    RANK_HANG,
    STRAGGLER,
    DetectionEvent,
)
from supervisor.decisions.triage import ALL_EXITED_GRACE_S, EXIT_GRACE_S, Triage

EXIT = DetectionEvent(RANK_EXITED, (1,), ("n2",))
HANG = DetectionEvent(RANK_HANG, (0,), ("n1",))
SILENT = DetectionEvent(NODE_SILENT, (), ("n2",))
SLOW = DetectionEvent(STRAGGLER, (1,), ("n2",))


def test_a_warning_is_journaled_and_never_ends_the_watch() -> None:
    t = Triage()
    verdict = t.sort([SLOW], 0.0, nodes_undecided=False)
    assert verdict.warnings == (SLOW,) and verdict.ending is None


def test_a_fault_ends_the_watch_with_every_fault_of_its_pass_and_the_pending_exits() -> None:
    t = Triage()
    assert t.sort([EXIT], 0.0, False).ending is None  # a rank gone: pending, not a fault yet
    verdict = t.sort([HANG, SILENT, SLOW], 1.0, False)
    assert verdict.ending == (EXIT, HANG, SILENT) and verdict.warnings == (SLOW,)


def test_a_hang_waits_for_the_verdict_on_a_quiet_node() -> None:
    t = Triage()
    assert t.sort([HANG], 0.0, nodes_undecided=True).ending is None  # the node may be lost, not the rank hung
    assert t.held == [HANG]
    assert t.sort([], 1.0, nodes_undecided=True).ending is None
    assert t.sort([], 2.0, nodes_undecided=False).ending == (HANG,)  # verdict in: the hang stands


def test_an_exit_is_a_fault_only_after_the_grace_time_unless_every_rank_ended() -> None:
    t = Triage()
    t.sort([EXIT], 10.0, False)
    running = [rank_view("n1", 0, 100), rank_view("n2", 1, 101, state="gone")]
    assert not t.exits_overdue(10.0 + EXIT_GRACE_S - 0.1, running)
    assert t.exits_overdue(10.0 + EXIT_GRACE_S + 0.1, running)
    all_gone = [rank_view("n1", 0, 100, state="gone"), rank_view("n2", 1, 101, state="gone")]
    assert not t.exits_overdue(10.0 + EXIT_GRACE_S + 0.1, all_gone)  # srun tears the step down: its report wins
    assert t.exits_overdue(10.0 + ALL_EXITED_GRACE_S + 0.1, all_gone)


def test_a_normal_finish_gets_the_finish_allowance() -> None:
    done = [rank_view("n2", 1, 101, state="gone", exit_code=0)]
    assert triage.exit_grace_s([EXIT], done, False, finish_allowance_s=30.0) == 30.0
    crashed = [rank_view("n2", 1, 101, state="gone", exit_code=1)]
    assert triage.exit_grace_s([EXIT], crashed, False, finish_allowance_s=30.0) == EXIT_GRACE_S
    assert triage.exit_grace_s([EXIT], crashed, True, finish_allowance_s=30.0) == ALL_EXITED_GRACE_S


def test_under_torchruns_own_restarts_a_rank_running_again_is_not_pending() -> None:
    t = Triage(worker_restarts=True)
    t.sort([EXIT], 0.0, False)
    again = [rank_view("n2", 1, 101, state="gone"), rank_view("n2", 1, 202)]  # a new process under rank 1
    assert not t.exits_overdue(ALL_EXITED_GRACE_S + 1, again)
    assert t.pending == [] and t.exited_since is None


KINDS = st.sampled_from([*sorted(FAULT_KINDS), STRAGGLER, LOSS_SPIKE])
PASSES = st.lists(st.tuples(st.lists(st.builds(DetectionEvent, KINDS, st.just((0,)), st.just(("n1",))),
                                     max_size=4), st.booleans()), min_size=1, max_size=12)  # fmt: skip


@settings(max_examples=300, deadline=None, derandomize=True)
@given(passes=PASSES)
def test_no_fault_is_lost_and_no_warning_ends_a_watch(passes: list[tuple[list[DetectionEvent], bool]]) -> None:
    """Over any sequence of passes: the watch ends exactly at the first pass with a fault that is neither an exit
    nor a hang held while a node is undecided (or a held hang once decided); the ending carries every fault seen
    so far, and warnings are handed back, never part of an ending."""
    t = Triage()
    seen: list[DetectionEvent] = []
    for i, (found, undecided) in enumerate(passes):
        verdict = t.sort(found, float(i), undecided)
        seen += [d for d in found if d.is_fault]
        assert set(verdict.warnings) == {d for d in found if not d.is_fault}
        decisive = [d for d in found if d.is_fault and d.kind != RANK_EXITED
                    and not (d.kind in HANG_KINDS and undecided)]  # fmt: skip
        held_decided = bool(t.held) and not undecided
        if verdict.ending is not None:
            assert decisive or held_decided
            assert sorted(verdict.ending, key=repr) == sorted(seen, key=repr)
            assert not [d for d in verdict.ending if not d.is_fault]
            return
        assert not decisive and not held_decided

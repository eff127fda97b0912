"""The site's repair loop as a plan (supervisor/decisions/repair.py): drain what counts as bad for everyone, with
the evidence as the reason; reboot once what a reboot fixes; never reboot a lemon; resume what an operator
forgave; forgive what came back fit from the loop's reboot; never touch another's drain; never drain more than
the stated share of the fleet."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from supervisor.decisions.repair import (
    HEALTH_DRAINED,
    REASON_TAG,
    Held,
    NodeNow,
    RepairConfig,
    plan,
    reboot_fixes,
)


def fleet(n: int = 20, **special: NodeNow) -> dict[str, NodeNow]:
    nodes = {f"n{i:02d}": NodeNow(f"n{i:02d}", "IDLE", False, None) for i in range(n)}
    nodes.update(special)
    return nodes


def kinds(steps: list) -> dict[str, str]:
    return {s.node: s.kind for s in steps}


def test_a_node_read_as_bad_is_drained_with_its_evidence_then_rebooted_once() -> None:
    held = {"n03": Held(("health check on n03: Xid 79: GPU has fallen off the bus",))}
    (drain,) = plan(fleet(), held, set(), set())
    assert (drain.kind, drain.node) == ("drain", "n03") and drain.reason.startswith(REASON_TAG)
    assert "Xid 79" in drain.reason
    drained = fleet(n03=NodeNow("n03", "IDLE", True, drain.reason))
    assert kinds(plan(drained, held, set(), set())) == {"n03": "reboot"}
    assert plan(drained, held, set(), {"n03"}) == []  # rebooted once: waiting for it


def test_what_a_reboot_cannot_fix_and_lemons_stay_drained_for_a_person() -> None:
    for why in (Held(("Xid 64: row remapping failed: replace the GPU",)), Held(("Xid 79",), lemon=True),
                Held(("Slurm node n03 is DOWN",))):  # fmt: skip
        drained = fleet(n03=NodeNow("n03", "IDLE", True, f"{REASON_TAG} x"))
        assert plan(drained, {"n03": why}, set(), set()) == []


def test_back_fit_from_the_reboot_is_forgiven_and_an_operators_forgiveness_resumes() -> None:
    held = {"n03": Held(("Xid 79",))}
    assert kinds(plan(fleet(), held, set(), {"n03"})) == {"n03": "forgive"}  # up, not drained: it passed
    still_bad = fleet(n03=NodeNow("n03", "IDLE", True, "HealthCheckProgram: Xid 79 again"))
    assert [s.reason for s in plan(still_bad, held, set(), {"n03"})] == [HEALTH_DRAINED]  # its drain, not ours
    waiting = RepairConfig(health_wait_s=65)
    assert kinds(plan(fleet(), held, set(), {"n03"}, waiting, {}, 1000.0)) == {"n03": "wait"}  # first seen back
    assert kinds(plan(fleet(), held, set(), {"n03"}, waiting, {"n03": 960.0}, 1000.0)) == {"n03": "wait"}
    assert kinds(plan(fleet(), held, set(), {"n03"}, waiting, {"n03": 930.0}, 1000.0)) == {"n03": "forgive"}
    ours = fleet(n03=NodeNow("n03", "IDLE", True, f"{REASON_TAG} lemon: 9 failures"))
    assert kinds(plan(ours, {}, {"n03"}, set())) == {"n03": "resume"}


def test_another_drain_or_a_down_node_is_never_touched() -> None:
    nodes = fleet(n01=NodeNow("n01", "IDLE", True, "maintenance (ops)"), n02=NodeNow("n02", "DOWN", False, None))
    assert plan(nodes, {"n01": Held(("Xid 79",)), "n02": Held(("Xid 79",))}, {"n01"}, set()) == []


@given(st.sets(st.integers(0, 49), max_size=50), st.sets(st.integers(0, 49), max_size=10),
       st.floats(0.02, 1.0))  # fmt: skip
def test_the_loop_never_holds_more_than_its_share_of_the_fleet(bad: set[int], already: set[int],
                                                              share: float) -> None:  # fmt: skip
    nodes = {f"n{i:02d}": NodeNow(f"n{i:02d}", "IDLE", i in already, f"{REASON_TAG} x" if i in already else None)
             for i in range(50)}  # fmt: skip
    steps = plan(nodes, {f"n{i:02d}": Held(("Xid 48",)) for i in bad}, set(), set(), RepairConfig(share))
    drains = [s for s in steps if s.kind == "drain"]
    assert len(drains) + len(already) <= max(int(share * 50), len(already))
    assert all(s.kind in ("drain", "wait", "reboot") for s in steps)
    waiting = {s.node for s in steps if s.kind == "wait"}
    assert waiting.isdisjoint({s.node for s in drains}) and all("not drained" in s.reason for s in steps
                                                                if s.kind == "wait")  # fmt: skip


def test_a_reboot_is_planned_only_when_every_xid_named_is_one_it_fixes() -> None:
    assert reboot_fixes(["Xid 79: fell off the bus"]) == 79
    assert reboot_fixes(["Xid 79", "Xid 64"]) is None and reboot_fixes(["no code here"]) is None

"""The site's repair loop carried out (supervisor/site/repair_loop.py) against an in-process fake Slurm that keeps
node states: a node another user's node agent read a hardware Xid from is drained with the evidence, rebooted
once, forgiven when it comes back fit; a program's printed text never drains anything; an operator's forgiveness
resumes a lemon; a refused reboot is recorded once and not retried; every step is in the site database."""

from __future__ import annotations

import threading
from dataclasses import replace

from slurm.errors import SlurmUsageError
from slurm.model import NodeInfo
from supervisor.decisions.repair import REASON_TAG
from supervisor.decisions.site_trust import SiteVerdict
from supervisor.site.repair_loop import RepairLoop
from supervisor.site.store import SiteStore

T0 = 1_800_000_000.0


class FakeSlurm:
    def __init__(self, n: int = 10, can_reboot: bool = True, health_interval: str | None = None) -> None:
        self.state = {f"n{i}": NodeInfo(f"n{i}", "IDLE") for i in range(n)}
        self.calls: list[tuple[str, str]] = []
        self.can_reboot = can_reboot
        self.health_interval = health_interval  # None: no HealthCheckProgram; "fail": the query fails

    def config(self) -> dict[str, str]:
        if self.health_interval == "fail":
            raise SlurmUsageError("scontrol show config failed", "retry")
        if self.health_interval is None:
            return {"HealthCheckProgram": "(null)", "HealthCheckInterval": "0 sec"}
        return {"HealthCheckProgram": "/opt/health.sh", "HealthCheckInterval": f"{self.health_interval} sec"}

    def nodes(self) -> list[NodeInfo]:
        return list(self.state.values())

    def drain(self, nodes: list[str], reason: str) -> None:
        for n in nodes:
            self.calls.append(("drain", n))
            self.state[n] = replace(self.state[n], flags=frozenset({"DRAIN"}), reason=reason)

    def resume(self, nodes: list[str]) -> None:
        for n in nodes:
            self.calls.append(("resume", n))
            self.state[n] = replace(self.state[n], flags=frozenset(), reason=None)

    def reboot(self, nodes: list[str], reason: str) -> None:
        if not self.can_reboot:
            raise SlurmUsageError("scontrol reboot failed: RebootProgram isn't defined", "configure it")
        for n in nodes:
            self.calls.append(("reboot", n))

    def booted(self, node: str) -> None:  # nextstate=RESUME after the reboot
        self.state[node] = replace(self.state[node], flags=frozenset(), reason=None)


def loop(tmp_path, slurm: FakeSlurm) -> tuple[RepairLoop, SiteStore, list[float]]:
    store = SiteStore(tmp_path)
    clock = [T0]
    return RepairLoop(store, slurm, threading.Lock(), clock=lambda: clock[0]), store, clock


def post(store: SiteStore, node: str, source: str, line: str, t: float, user: str = "alice") -> None:
    store.add_verdict(SiteVerdict(node=node, user=user, source=source, klass="hardware", campaign="c", t=t),
                      confidence=0.9, evidence=[line], job="1")  # fmt: skip


def test_drained_with_its_evidence_rebooted_once_then_forgiven_when_back_fit(tmp_path) -> None:
    slurm = FakeSlurm()
    r, store, clock = loop(tmp_path, slurm)
    post(store, "n3", "node", "health check on n3: Xid 79: GPU has fallen off the bus", T0 - 60)
    post(store, "n4", "program", "Xid 79 printed by the program", T0 - 60, user="bob")
    r.round()
    assert slurm.calls == [("drain", "n3")] and slurm.state["n3"].reason.startswith(f"{REASON_TAG} health check")
    clock[0] += 60
    r.round()
    assert slurm.calls[-1] == ("reboot", "n3")
    clock[0] += 60
    r.round()  # still rebooting (drained): nothing
    assert slurm.calls[-1] == ("reboot", "n3") and len(slurm.calls) == 2
    slurm.booted("n3")
    clock[0] += 60
    r.round()
    assert store.forgiven_at().get("n3") == clock[0]
    clock[0] += 60
    assert r.round() == [] and slurm.calls == [("drain", "n3"), ("reboot", "n3")]  # not drained again
    assert [x["kind"] for x in store.repairs()] == ["drain", "reboot", "forgive"]


def test_back_from_the_reboot_it_is_forgiven_only_after_a_health_check_interval_without_a_drain(tmp_path) -> None:
    """Slurm resumes a rebooted node at once (nextstate=RESUME); its HealthCheckProgram drains it again only at
    its next run: the loop forgives it after a whole interval (60 s + 5) undrained. Drained by the check
    meanwhile, it waits for the check to pass, then for a whole interval again. An unreadable Slurm
    configuration waits as for a check every 5 minutes."""
    slurm = FakeSlurm(health_interval="60")
    r, store, clock = loop(tmp_path, slurm)
    post(store, "n3", "node", "health check on n3: Xid 79: GPU has fallen off the bus", T0 - 60)
    r.round()
    clock[0] += 1
    r.round()
    assert slurm.calls == [("drain", "n3"), ("reboot", "n3")]
    slurm.booted("n3")
    for _ in range(6):  # back, undrained, for 60 s: not long enough
        clock[0] += 10
        r.round()
    assert "n3" not in store.forgiven_at()
    slurm.state["n3"] = replace(slurm.state["n3"], flags=frozenset({"DRAIN"}), reason="supervise: xid 79")
    clock[0] += 10
    r.round()  # its health check found it unfit: not forgiven
    clock[0] += 300
    r.round()
    assert "n3" not in store.forgiven_at()
    slurm.booted("n3")  # the check passed and resumed it: a whole interval again from here
    clock[0] += 1
    r.round()
    back = clock[0]
    clock[0] += 40
    r.round()
    assert "n3" not in store.forgiven_at()
    clock[0] += 30
    r.round()
    assert store.forgiven_at().get("n3") == clock[0] and clock[0] - back >= 65
    waits = [x["reason"] for x in store.repairs() if x["kind"] == "wait"]
    assert len(waits) == 3  # back, drained by its check, back: each recorded once

    assert RepairLoop(store, FakeSlurm(health_interval="fail"), threading.Lock())._health_wait_s() == 305.0
    assert RepairLoop(store, FakeSlurm(), threading.Lock())._health_wait_s() == 0.0


def test_a_refused_reboot_is_recorded_once_and_the_node_waits_for_a_person(tmp_path) -> None:
    slurm = FakeSlurm(can_reboot=False)
    r, store, clock = loop(tmp_path, slurm)
    post(store, "n1", "node", "Xid 48: double-bit ECC error", T0 - 60)
    for _ in range(4):
        r.round()
        clock[0] += 60
    kinds = [(x["kind"], x["error"] is not None) for x in store.repairs()]
    assert kinds == [("drain", False), ("reboot", True)] and slurm.state["n1"].is_drain
    assert "RebootProgram" in str(store.repairs()[-1]["error"])


def test_an_operators_forgiveness_resumes_a_node_the_loop_drained(tmp_path) -> None:
    slurm = FakeSlurm()
    r, store, clock = loop(tmp_path, slurm)
    post(store, "n2", "slurm", "Slurm node n2 is DOWN", T0 - 60)
    r.round()
    assert slurm.state["n2"].is_drain
    clock[0] += 60
    store.forgive("n2", clock[0], by="ops")
    clock[0] += 1
    r.round()
    assert slurm.calls == [("drain", "n2"), ("resume", "n2")] and not slurm.state["n2"].is_drain

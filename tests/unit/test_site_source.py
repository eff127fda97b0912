"""The evidence a node verdict rests on, as the site ledger sorts it (supervisor/decisions/site_source.py): a
printed Xid line is the program's, a health-check finding the node's, a DOWN node Slurm's."""

from __future__ import annotations

import pytest

from supervisor.decisions import events as ev
from supervisor.decisions.interruption import AGENT, PROGRAM, SLURM, Interruption
from supervisor.decisions.site_source import verdict_source


@pytest.mark.parametrize(("cls", "witnesses", "source"), [
    (ev.HARDWARE, (PROGRAM,), "program"),  # "Xid 79" printed by the program: text
    (ev.HARDWARE, (AGENT,), "node"),  # the agent's health check read it from the node
    (ev.NODE_FAILURE, (SLURM,), "slurm"),
    (ev.NODE_FAILURE, (AGENT,), "program"),  # an agent gone silent: a program can kill it
    (ev.HANG, (AGENT,), "program"),  # heartbeats that stopped: the program's behaviour
    (ev.APP_ERROR, (PROGRAM,), "program"),
    (ev.HARDWARE, (AGENT, PROGRAM), "node"),
    (ev.COMM_ERROR, (SLURM,), "program"),
])  # fmt: skip
def test_each_witness_gives_its_source(cls: str, witnesses: tuple[str, ...], source: str) -> None:
    assert verdict_source(Interruption(cls, ("node1",), 0.9, ("x",), witnesses=witnesses)) == source


def test_a_health_check_drain_is_hardware_when_the_gpus_are_at_fault() -> None:
    from supervisor.decisions.site_source import healthcheck_verdict
    from supervisor.health.checks import FATAL, WARN, Problem

    xid = Problem(FATAL, "GPU 0 reported Xid 79: GPU has fallen off the bus", "drain", "xid", "79", "hardware Xid")
    ecc = Problem(FATAL, "GPU 1 has 3 uncorrectable ECC errors", "drain", "gpu1_ecc_uncorrectable", "3", "0")
    full = Problem(FATAL, "checkpoint (/scratch) has 0.1 GiB free", "free space", "fs_free:/scratch", "0.1", "10")
    warm = Problem(WARN, "GPU 0 runs at 90 C", "cooling", "gpu0_temperature", "90C", "87C")
    klass, evidence = healthcheck_verdict([warm, full, xid])  # type: ignore[misc]
    assert klass == "hardware" and len(evidence) == 2 and "Xid 79" in evidence[1]
    assert healthcheck_verdict([ecc])[0] == "hardware"  # type: ignore[index]
    assert healthcheck_verdict([full])[0] == "node_unfit"  # type: ignore[index]
    assert healthcheck_verdict([warm]) is None  # nothing fatal: nothing drained, nothing told

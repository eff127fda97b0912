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

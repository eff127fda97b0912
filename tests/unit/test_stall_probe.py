"""The stall probe (driver/stall_probe.py) with an in-process channel whose agents answer with the real stacks of
tests/fixtures/stacks (rank 1 hung after its step, ranks 0 and 2 wait for it in DDP's backward)."""

from __future__ import annotations

from collections import deque
from pathlib import Path
from typing import Any

from supervisor.decisions.detect.findings import RANK_HANG
from supervisor.decisions.detect.hang import Overdue
from supervisor.driver.context import Context
from supervisor.driver.stall_probe import StallProbe
from supervisor.heartbeat import wire
from supervisor.paths import CampaignPaths

FIXTURES = Path(__file__).parents[1] / "fixtures" / "stacks"
LIVE = [(0, "n1"), (1, "n2"), (2, "n3")]


class Table:
    def __init__(self) -> None:
        self.events: deque[dict[str, Any]] = deque()


class Agents:
    """Each node's agent saves the asked rank's dump in the campaign's stacks directory and answers its path."""

    def __init__(self, campaign: Path, where: Path | None = None) -> None:
        self.table = Table()
        self.dir = where or CampaignPaths(campaign).stacks
        self.dir.mkdir(parents=True, exist_ok=True)
        self.asked: list[tuple[str, int]] = []

    def send(self, node: str, cmds: list[Any]) -> bool:
        for cmd in cmds:
            assert cmd.command == wire.CMD_DUMP_STACKS
            self.asked.append((node, cmd.rank))
            out = self.dir / f"{node}-rank{cmd.rank}.txt"
            out.write_text((FIXTURES / f"rank{cmd.rank}.faulthandler.txt").read_text())
            self.table.events.append({"event": "stacks_saved", "node": node, "rank": cmd.rank, "text": str(out)})
        self.table.events.append({"event": "health", "node": node, "rank": -1, "text": "kept for others"})
        return True


def overdue(*ranks: int) -> dict[int, Overdue]:
    return {r: Overdue(dict(LIVE)[r], 12.0, 5.0, "step", 3) for r in ranks}


def probe(tmp_path: Path, agents: Agents) -> StallProbe:
    return StallProbe(Context.of(lambda e: None), agents, tmp_path, wait_s=5.0)


def test_the_rank_the_others_wait_for_is_named_with_its_own_timeout(tmp_path):
    agents = Agents(tmp_path)
    p = probe(tmp_path, agents)
    assert p.update(overdue(0, 1, 2), LIVE) is None and p.pending  # asked
    assert sorted(agents.asked) == [("n1", 0), ("n2", 1), ("n3", 2)]
    found = p.update(overdue(0, 1, 2), LIVE)
    assert found is not None and found.kind == RANK_HANG
    assert found.ranks == (1,) and found.nodes == ("n2",) and found.threshold == 5.0
    assert "rank 1 is not waiting for its peers" in found.evidence[0]
    assert any("own step timeout 5.0s" in line for line in found.evidence)
    assert [e["event"] for e in agents.table.events] == ["health"] * 3  # other events stay on the queue
    assert p.update(overdue(0, 1, 2), LIVE) is None and not p.pending  # the same stall is probed once


def test_peers_are_asked_too_when_only_the_stuck_rank_is_overdue(tmp_path):
    agents = Agents(tmp_path)
    p = probe(tmp_path, agents)
    p.update(overdue(1), LIVE)
    assert {r for _, r in agents.asked} == {0, 1, 2}
    found = p.update(overdue(1), LIVE)
    assert found is not None and found.ranks == (1,)


def test_nobody_is_named_when_the_waiting_ranks_are_the_overdue_ones_and_their_dumps_go(tmp_path):
    agents = Agents(tmp_path)
    p = probe(tmp_path, agents)
    p.update(overdue(0, 2), LIVE)  # rank 0 saving alone, the others in a barrier: they wait, nobody is odd
    assert p.update(overdue(0, 2), LIVE) is None
    assert not list(agents.dir.iterdir())  # dumps that named nobody are removed


def test_a_rank_that_beat_again_meanwhile_is_not_named(tmp_path):
    agents = Agents(tmp_path)
    p = probe(tmp_path, agents)
    p.update(overdue(0, 1, 2), LIVE)
    assert p.update(overdue(0, 2), LIVE) is None


def test_a_dump_outside_the_campaigns_stacks_directory_is_not_read(tmp_path):
    agents = Agents(tmp_path, where=tmp_path / "elsewhere")
    p = probe(tmp_path, agents)
    p.update(overdue(0, 1, 2), LIVE)
    assert p.update(overdue(0, 1, 2), LIVE) is None  # every stack unknown: nobody named


def test_no_answer_in_time_names_nobody(tmp_path):
    class Silent(Agents):
        def send(self, node: str, cmds: list[Any]) -> bool:
            return True

    agents = Silent(tmp_path)
    p = StallProbe(Context.of(lambda e: None), agents, tmp_path, wait_s=0.0)
    p.update(overdue(1), LIVE)
    assert p.update(overdue(1), LIVE) is None and not p.pending


def test_too_many_overdue_ranks_is_left_to_the_global_stall(tmp_path):
    agents = Agents(tmp_path)
    p = probe(tmp_path, agents)
    many = {r: Overdue("n1", 9.0, 5.0, "step", 3) for r in range(100)}
    assert p.update(many, LIVE) is None and not p.pending and not agents.asked

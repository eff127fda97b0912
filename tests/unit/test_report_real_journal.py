"""``report --json`` on a journal from a real campaign: ``examples/demo.py`` on the local Slurm 22.05 cluster
(2026-12-03; 2 nodes of 4, 150 steps): rank 1 hung with SIGSTOP and was relaunched in the allocation, then node2
crashed and the job was requeued onto node3 and node4, where it completed (tests/golden/demo-journal.jsonl, the
campaign's journal as written). Issue 13: the report carries every bucket per attempt and per interruption class,
and they add up to the wall clock."""

from __future__ import annotations

import json
from pathlib import Path

from supervisor import campaign, cli
from supervisor.decisions.goodput import BADPUT

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "demo-journal.jsonl"


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def test_report_json_of_a_real_campaign_carries_every_bucket_per_attempt_and_per_class(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    paths = campaign.create(tmp_path / "c", campaign.CampaignSpec(command=("train",)), "# the demo's campaign\n")
    Path(paths.journal).write_bytes(GOLDEN.read_bytes())
    assert cli.main(["report", str(tmp_path / "c"), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["state"] == "completed"
    g = doc["goodput"]
    attempts = doc["attempts"]
    assert [a["outcome"]["class"] for a in attempts] == ["hang", "node_failure", "completed"]
    # every bucket, zeros included: for the campaign, before the first launch, per attempt and per class
    for badput in (g["badput_s"], g["before_first_launch_s"], *(a["goodput"]["badput_s"] for a in attempts),
                   *(c["badput_s"] for c in g["by_class"].values())):  # fmt: skip
        assert sorted(badput) == sorted(BADPUT)
    assert all({"wall_s", "productive_s", "kept_steps"} <= set(a["goodput"]) for a in attempts)
    # the campaign's buckets are the wall clock to the millisecond; so are the attempts' with the time before
    # the first launch; each class's total is its buckets' sum
    wall = _ms(g["wall_s"])
    assert _ms(g["productive_s"]) + sum(_ms(v) for v in g["badput_s"].values()) == wall
    rows = sum(_ms(a["goodput"]["productive_s"]) + sum(_ms(v) for v in a["goodput"]["badput_s"].values())
               for a in attempts)  # fmt: skip
    assert rows + sum(_ms(v) for v in g["before_first_launch_s"].values()) == wall
    assert all(_ms(a["goodput"]["wall_s"]) == _ms(a["goodput"]["productive_s"]) + sum(
        _ms(v) for v in a["goodput"]["badput_s"].values()) for a in attempts)  # fmt: skip
    # the two injected faults, each charged to its class: the hang's silent rank before it was called, the
    # crash's requeue (queue wait and the new run's preflight and start-up)
    assert set(g["by_class"]) == {"hang", "node_failure"}
    hang, crash = g["by_class"]["hang"], g["by_class"]["node_failure"]
    assert hang["interruptions"] == 1 and crash["interruptions"] == 1
    assert hang["badput_s"]["detection"] > 0 and hang["badput_s"]["queue"] == 0
    assert crash["badput_s"]["queue"] > 0 and crash["badput_s"]["preflight"] > 0 and crash["badput_s"]["restart"] > 0
    for c in (hang, crash):
        assert _ms(c["total_s"]) == sum(_ms(v) for v in c["badput_s"].values())
    assert g["productive_s"] > 0 and g["ideal_step_s"] and g["badput_s"]["checkpoint"] > 0

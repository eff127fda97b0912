"""`supervise cancel`: the user's stop request reaches the running supervisor, which (optionally after a save)
stops the campaign for good: class `cancelled`, state stopped "cancelled by the user", nothing requeued."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from fakes import Launch
from test_driver import make, run

from supervisor import campaign, cli, stop_request
from supervisor.campaign import CampaignSpec
from supervisor.decisions import events as ev
from supervisor.decisions import policy


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.parametrize("checkpoint", [False, True])
def test_a_stop_request_stops_the_campaign_for_good(tmp_path: Path, checkpoint: bool) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(None)])
    stop_request.write(sup.paths.root, checkpoint=checkpoint, t=1.0)
    r = run(sup, slurm, launcher, channel)
    assert r.code == 1  # the batch step ends: Slurm records a stopped job, never requeued
    assert r.classes() == [ev.CANCELLED] and r.of(ev.INTERRUPTION)[0]["blamed_nodes"] == []
    ended = r.of(ev.CAMPAIGN_ENDED)[-1]
    assert ended["state"] == "stopped" and ended["reason"] == "cancelled by the user"
    assert not [c for c in slurm.calls if c[0] in ("requeue", "requeue_hold")]
    assert bool(r.of(ev.CHECKPOINT_REQUESTED)) == checkpoint
    assert (policy.CHECKPOINT_NOW in r.actions()) == checkpoint
    assert channel.current is not None and channel.current.returncode is not None  # nothing left running
    assert not stop_request.path(sup.paths.root).exists()  # handled: the next submit is not stopped by it


def test_the_request_file_is_private_and_a_garbled_one_still_means_stop(tmp_path: Path) -> None:
    target = stop_request.write(tmp_path, checkpoint=True, t=5.0)
    assert target.stat().st_mode & 0o777 == 0o600
    assert stop_request.read(tmp_path) == stop_request.StopRequest(True, 5.0)
    target.write_text("{not json")
    assert stop_request.read(tmp_path) == stop_request.StopRequest(False, 0.0)
    stop_request.clear(tmp_path)
    assert stop_request.read(tmp_path) is None


def new_campaign(tmp_path: Path) -> Path:
    root = tmp_path / "c"
    campaign.create(root, CampaignSpec(command=("python", "train.py")), "#!/bin/bash\n")
    return root


def test_cancel_before_the_campaign_started_needs_the_job_id(tmp_path: Path, capsys) -> None:
    root = new_campaign(tmp_path)
    code = cli.main(["cancel", str(root)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--job JOBID" in err


def test_cancel_of_an_ended_campaign_says_so(tmp_path: Path, capsys) -> None:
    from supervisor.journal import Journal

    root = new_campaign(tmp_path)
    with Journal(root / "journal.jsonl") as j:
        j.append(ev.campaign_started(1.0, str(root), ["python"], "9"))
        j.append(ev.campaign_ended(2.0, "completed", "done"))
    assert cli.main(["cancel", str(root)]) == 0
    assert "already ended (completed" in capsys.readouterr().out


def test_cancel_of_a_missing_campaign_is_a_campaign_error(tmp_path: Path, capsys) -> None:
    assert cli.main(["cancel", str(tmp_path / "nope")]) == 7
    assert capsys.readouterr().err.count("\n") == 1

"""The loop never dies of one stage (issue 9 item 8): an exception from a detector, the heartbeat channel's
live.json write, an alert sink, the checkpoint scan, a Slurm query or an actuator is journaled as
``supervisor_error`` {stage, error} and supervision goes on. Each is injected into the real ``Supervisor``
driven by the in-process fakes (tests/unit/fakes.py)."""

from __future__ import annotations

import dataclasses
import signal
import socketserver
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import Launch
from test_driver import JOB, Run, make, run

from slurm.errors import SlurmError
from supervisor.config import from_mapping
from supervisor.decisions import events as ev
from supervisor.decisions.detect.loss import LossConfig, LossDetector
from supervisor.driver import guard as guard_module
from supervisor.driver.checkpoint_tracker import CheckpointTracker
from supervisor.driver.guard import Guard, GuardedChannel

DONE = {"state": "exited", "exit_code": 0}


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def errors(r: Run, stage: str) -> list[dict[str, Any]]:
    return [e for e in r.of(ev.SUPERVISOR_ERROR) if e["stage"] == stage]


def test_a_detector_that_raises_every_pass_is_journaled_once_and_the_campaign_completes(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, polls=40, ranks=DONE)])

    def broken(snapshot: Any, now: float) -> Any:
        raise RuntimeError("detector bug")

    sup.detector.observe = broken  # type: ignore[method-assign]
    sup.config = dataclasses.replace(sup.config, run=dataclasses.replace(sup.config.run, loop_interval_s=0.0))
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0 and r.of(ev.CAMPAIGN_ENDED)[-1]["state"] == "completed"
    found = errors(r, "detect")
    assert len(found) == 1 and found[0]["error"] == "RuntimeError: detector bug"  # repeats are not journaled


def test_a_loss_of_1e160_neither_raises_nor_hides_the_spike() -> None:
    detector = LossDetector(LossConfig())
    from fakes import rank_view

    from supervisor.decisions.detect import snapshot_from_live
    from supervisor.heartbeat.table import Snapshot

    spikes = []
    for step in range(1, 80):
        loss = 1e160 if step == 70 else 2.0 + 0.01 * (step % 3)
        live = Snapshot(time.time(), JOB, {}, [rank_view("n1", 0, 5, step=step, loss=loss, loss_step=step)], {})
        spikes += detector.observe(snapshot_from_live(live, launch_age_s=100.0), float(step))  # never raises
    assert [d.kind for d in spikes] == ["loss_spike"]


def test_an_unwritable_live_json_is_journaled_and_receiving_goes_on(tmp_path: Path) -> None:
    from supervisor.heartbeat.server import AggregatorServer

    (tmp_path / "live.json").mkdir()  # what made poll() raise IsADirectoryError
    server = AggregatorServer(tmp_path, JOB, bind=("127.0.0.1", 0), live_interval_s=0.0)
    journal: list[dict[str, Any]] = []
    channel = GuardedChannel(server, Guard(journal.append))
    try:
        deadline = time.monotonic() + 5
        while not journal and time.monotonic() < deadline:
            assert channel.poll(0.01) >= 0
        for _ in range(20):
            channel.poll(0.0)
    finally:
        channel.close()
    assert [(e["type"], e["stage"]) for e in journal] == [(ev.SUPERVISOR_ERROR, "heartbeat")]
    assert "IsADirectoryError" in journal[0]["error"]


def test_a_failing_channel_poll_does_not_end_supervision(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, polls=5, ranks=DONE)])
    real_poll = channel.poll

    def poll(timeout: float) -> int:
        real_poll(timeout)
        raise IsADirectoryError(21, "Is a directory", "live.json")

    channel.poll = poll  # type: ignore[method-assign]
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0 and r.classes() == [ev.COMPLETED]
    assert "IsADirectoryError" in errors(r, "heartbeat")[0]["error"]


class GarbageHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        self.request.recv(65536)
        self.request.sendall(b"this is not HTTP\r\n\r\n")


def test_a_webhook_answering_garbage_does_not_stop_the_response(tmp_path: Path) -> None:
    server = socketserver.TCPServer(("127.0.0.1", 0), GarbageHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        nan = Launch(None, ranks={"loss": float("nan"), "loss_step": 12}, stops_on_flags=False)
        sup, slurm, launcher, channel, _ = make(tmp_path, [nan])
        sup.config = from_mapping({"alerts": {"webhook_url": f"http://127.0.0.1:{server.server_address[1]}/",
                                              "retries": 1, "timeout_s": 2.0},
                                   "policy": {"budgets": {"numerical": 0}}})  # a NaN stops at once  # fmt: skip
        r = run(sup, slurm, launcher, channel)
    finally:
        server.shutdown()
        server.server_close()
    assert r.code == 1 and r.of(ev.CAMPAIGN_ENDED)[-1]["state"] == "failed"  # the stop still happened
    assert "alert" in r.actions()


def test_an_alert_actuator_that_raises_is_journaled_and_the_next_actions_run(tmp_path: Path, monkeypatch) -> None:
    import http.client

    from supervisor.driver import actuators

    def broken(*args: Any, **kwargs: Any) -> None:
        raise http.client.BadStatusLine("garbage")

    monkeypatch.setattr(actuators.Actuators, "alert", lambda self, action, s: broken())
    nan = Launch(None, ranks={"loss": float("nan"), "loss_step": 12}, stops_on_flags=False)
    sup, slurm, launcher, channel, _ = make(tmp_path, [nan])
    sup.config = from_mapping({"policy": {"budgets": {"numerical": 0}}})  # a NaN stops at once
    r = run(sup, slurm, launcher, channel)
    assert r.code == 1 and r.of(ev.CAMPAIGN_ENDED)[-1]["state"] == "failed"
    assert errors(r, "action:alert")[0]["error"] == "BadStatusLine: garbage"


def test_a_checkpoint_scan_that_raises_is_journaled_and_resume_is_left_to_the_program(
        tmp_path: Path, monkeypatch) -> None:  # fmt: skip
    def broken(self: CheckpointTracker) -> Any:
        raise ValueError("manifest: unexpected key")

    monkeypatch.setattr(CheckpointTracker, "pick_resume", broken)
    monkeypatch.setattr(CheckpointTracker, "scan", broken)
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, polls=3, ranks=DONE)])
    sup.config = from_mapping({"run": {"checkpoint_dir": str(tmp_path / "ckpt")}})
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0 and r.classes() == [ev.COMPLETED]
    assert errors(r, "checkpoint_scan")[0]["error"] == "ValueError: manifest: unexpected key"
    train_env = launcher.envs[-1]
    assert "SUPERVISOR_RESUME_FROM" not in train_env  # unknown, never "fresh start" ("")


def test_a_slurm_query_raising_something_unexpected_is_unknown_evidence(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, ranks=DONE)])

    def broken(job_id: str | int) -> Any:
        raise ValueError("squeue: unparsable line")

    slurm.job = broken  # type: ignore[method-assign]
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0 and r.classes() == [ev.COMPLETED]
    assert errors(r, "slurm_query")


def test_a_failing_actuator_is_journaled_and_the_loop_goes_on(tmp_path: Path) -> None:
    sup, slurm, launcher, channel, inbox = make(tmp_path, [Launch(None), Launch(0, ranks=DONE)])
    slurm.set_job(end_time=int(time.time()) + 60)
    inbox.deliver_after(3, "SIGUSR1")

    def requeue(job_id: str | int) -> None:
        raise SlurmError(["scontrol", "requeue"], "Requested operation is presently disabled")

    slurm.requeue = requeue  # type: ignore[method-assign]
    r = run(sup, slurm, launcher, channel)
    assert r.classes()[0] == ev.TIMEOUT
    assert errors(r, "action:requeue")
    assert r.code == 0 and r.of(ev.CAMPAIGN_ENDED)[-1]["state"] == "completed"  # supervised to the end


def test_the_same_error_is_journaled_again_after_the_repeat_window(monkeypatch) -> None:
    journal: list[dict[str, Any]] = []
    g = Guard(journal.append, clock=lambda: 1.0)
    for _ in range(5):
        assert g.call("detect", lambda: 1 / 0, default=7) == 7
    monkeypatch.setattr(guard_module, "REPEAT_S", 0.0)
    g.call("detect", lambda: 1 / 0, default=7)
    assert [e["repeats"] for e in journal] == [0, 4]


def test_a_type_confused_event_in_the_journal_does_not_stop_the_next_run(tmp_path: Path) -> None:
    """Issue 22, low: the loop folds the journal at every start; one odd event (a bug, a hand edit) made every
    restart die there. It is skipped and counted, and the campaign goes on."""
    from fakes import Launch
    from test_driver import make, run

    from supervisor.decisions import events as ev

    first, *_ = make(tmp_path, [])
    with first.recorder.journal as journal:
        journal.append(ev.campaign_started(1.0, "/c", ["python", "train.py"], "7"))
        journal.append({"type": ev.STEP_LAUNCHED, "t": 2.0, "launch": {"odd": 1}, "nodes": 5, "excluded": "n2"})
        journal.append({"type": ev.ATTEMPT_ENDED, "t": 3.0, "outcome": ["not", "a", "mapping"]})
        journal.append({"type": ev.TIMEOUTS_LEARNED, "t": 4.0, "histograms": "nope"})
    sup, slurm, launcher, channel, _ = make(tmp_path, [Launch(0, ranks={"state": "exited", "exit_code": 0})])
    r = run(sup, slurm, launcher, channel)
    assert r.code == 0 and r.classes()[-1] == ev.COMPLETED

"""The run the batch script requeued after its supervisor died of a signal (supervisor/batchwrap.py): it reads
the script's line from the batch log and continues the campaign from the journal, unless the campaign had
already ended or the supervisor keeps dying (then it stops instead of a requeue loop). Real ``Supervisor`` on
the fakes of test_driver."""

from __future__ import annotations

from pathlib import Path

from fakes import Launch
from test_driver import JOB, NODES, make, run

from supervisor.decisions import campaign_state, silent_end
from supervisor.decisions import events as ev
from supervisor.decisions.policy import PolicyConfig
from supervisor.journal import read

DIED = ("supervise: the supervisor died of signal 9 in job 7 run {run} with nothing ending the job: requeued the "
        "job; its next run continues the campaign from the journal\n")  # fmt: skip
DONE = Launch(0, ranks={"state": "exited", "exit_code": 0})


def _previous(sup, tmp_path: Path, events: list[dict], died_in_run: int | None) -> None:
    with sup.recorder.journal as journal:
        for e in events:
            journal.append(e)
    logs = tmp_path / "campaign" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    text = '{"event": "step_launched"}\n' + (DIED.format(run=died_in_run) if died_in_run is not None else "")
    (logs / f"batch-{JOB}.out").write_text(text)


def test_the_run_after_the_supervisors_death_continues_the_campaign_and_blames_nobody(tmp_path):
    sup, *_ = make(tmp_path, [DONE])
    _previous(sup, tmp_path, [ev.campaign_started(1.0, "/c", ["python", "train.py"], JOB),
                              ev.attempt_started(2.0, JOB, 0, NODES, None),
                              {"type": ev.DETECTION, "t": 3.0, "kind": "node_silent", "nodes": ["n2"]}],
              died_in_run=0)  # (a node silent before the death is not blamed for it either)
    sup2, slurm, launcher, channel, _ = make(tmp_path, [DONE])
    r = run(sup2, slurm, launcher, channel)
    assert r.code == 0 and len(r.of(ev.CAMPAIGN_STARTED)) == 1
    inferred = r.of(ev.INTERRUPTION)[0]
    assert inferred["class"] == ev.UNKNOWN and inferred["blamed_nodes"] == []
    assert "died of signal 9" in inferred["evidence"][0]
    assert r.of(ev.CAMPAIGN_ENDED)[-1]["state"] == "completed" and len(r.of(ev.STEP_LAUNCHED)) == 1


def test_a_line_about_another_run_is_not_this_runs_evidence(tmp_path):
    sup, *_ = make(tmp_path, [DONE])
    _previous(sup, tmp_path, [ev.campaign_started(1.0, "/c", ["python", "train.py"], JOB),
                              ev.attempt_started(2.0, JOB, 3, NODES, None)], died_in_run=2)
    sup2, slurm, launcher, channel, _ = make(tmp_path, [DONE])
    r = run(sup2, slurm, launcher, channel)
    assert not any("died of signal" in line for line in r.of(ev.INTERRUPTION)[0]["evidence"])


def test_a_campaign_that_had_ended_before_its_supervisor_died_is_not_run_again(tmp_path):
    sup, *_ = make(tmp_path, [DONE])
    _previous(sup, tmp_path, [ev.campaign_started(1.0, "/c", ["python", "train.py"], JOB),
                              ev.attempt_started(2.0, JOB, 0, NODES, None),
                              ev.campaign_ended(3.0, "completed", "training completed")], died_in_run=0)
    before = read(sup.paths.journal)
    sup2, slurm, launcher, channel, _ = make(tmp_path, [DONE])
    r = run(sup2, slurm, launcher, channel)
    assert r.code == 0 and r.events == before and not r.of(ev.STEP_LAUNCHED)


def test_a_supervisor_that_keeps_dying_stops_the_campaign_instead_of_a_requeue_loop(tmp_path):
    sup, *_ = make(tmp_path, [DONE])
    events = [ev.campaign_started(1.0, "/c", ["python", "train.py"], JOB)]
    for i in range(3):  # three earlier deaths, as the runs after them inferred, no checkpoint in between
        t = 10.0 + i
        events += [ev.attempt_started(t, JOB, i, NODES, None),
                   ev.interruption_event(t + 0.5, ev.UNKNOWN, [], 0.5, ["the batch script: ..."]),
                   ev.attempt_ended(t + 0.5, JOB, ev.UNKNOWN)]  # fmt: skip
    events.append(ev.attempt_started(20.0, JOB, 3, NODES, None))
    _previous(sup, tmp_path, events, died_in_run=3)
    sup2, slurm, launcher, channel, _ = make(tmp_path, [DONE])
    r = run(sup2, slurm, launcher, channel)
    assert r.code == 1 and not r.of(ev.STEP_LAUNCHED) and not [c for c in slurm.calls if "requeue" in c[0]]
    ended = r.of(ev.CAMPAIGN_ENDED)[-1]
    assert ended["state"] == "failed" and "keeps dying" in ended["reason"]


def test_after_supervisor_death_decides_nothing_without_the_scripts_line():
    state = campaign_state.fold([ev.campaign_started(1.0, "/c", ["x"], JOB), ev.attempt_started(2.0, JOB, 0, NODES, None),
                                 ev.campaign_ended(3.0, "completed")])  # fmt: skip
    assert silent_end.after_supervisor_death(state, None, PolicyConfig(), 4.0) is None
    assert silent_end.after_supervisor_death(state, DIED.format(run=0), PolicyConfig(), 4.0)[0] == "completed"

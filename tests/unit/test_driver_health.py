"""The agents' health reports in the supervisor: journaled when they change, a fatal finding makes its node unfit
(for the rest of the Slurm run), a shared filesystem blames nobody; in the real loop (fakes around it) an unfit
node of the launch ends the launch as a hardware interruption blaming it, and the next launch excludes it."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeChannel, FakeInbox, FakeLauncher, FakeSlurm, Launch

from slurm.env import SlurmEnv
from slurm.model import JobInfo
from supervisor.campaign import CampaignPaths, CampaignSpec
from supervisor.config import Config, RunConfig
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.driver.compose import Attempt
from supervisor.driver.context import Context
from supervisor.driver.health_watch import HealthWatch, detections, gpu_faults
from supervisor.health.checks import Limits
from supervisor.health.preflight import PreflightConfig
from supervisor.heartbeat.wire import HealthItem, HealthReport
from supervisor.journal import read


@pytest.fixture(autouse=True)
def keep_sigterm() -> Iterator[None]:
    """The requeue actuators ignore SIGTERM (Slurm's KillWait is their time); give pytest its handler back, or
    every process started later inherits the ignored SIGTERM."""
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


ECC = HealthItem("fatal", "gpu0_ecc_uncorrectable", "2", "0", "GPU 0 has 2 uncorrectable ECC errors", "reset it")
HOT = HealthItem("warn", "gpu0_temperature", "93C", "90C", "GPU 0 runs at 93 C", "check the cooling")
FULL = HealthItem("fatal", "fs_free:/ckpt", "1.0GiB", "5.0GiB", "the checkpoint filesystem has 1.0GiB free", "free")


class Table:
    def __init__(self) -> None:
        self.health: dict[str, tuple[float, HealthReport]] = {}
        self.t = 0.0

    def report(self, node: str, *items: HealthItem) -> None:
        self.t += 1.0
        self.health[node] = (self.t, HealthReport("ok", tuple(items)))


def _watch(nodes: tuple[str, ...] = ("n1", "n2", "n3")) -> tuple[HealthWatch, list[dict[str, Any]], Table]:
    journal: list[dict[str, Any]] = []
    return HealthWatch(Context.of(journal.append, lambda: 5.0), nodes), journal, Table()


def test_changes_are_journaled_and_a_fatal_finding_stays_for_the_run() -> None:
    watch, journal, table = _watch()
    table.report("n1")
    table.report("n2", HOT)
    watch.update(table)
    watch.update(table)  # nothing new
    assert [(e["node"], e["unfit"]) for e in journal] == [("n2", False)]  # a clean first report is not news
    table.report("n2", HOT, ECC)
    watch.update(table)
    assert journal[-1]["unfit"] and [f["check"] for f in journal[-1]["findings"]] == [HOT.check, ECC.check]
    table.report("n2")  # the next check is clean (an Xid is reported once): still unfit in this run
    watch.update(table)
    assert journal[-1]["findings"] == [] and not journal[-1]["unfit"] and len(journal) == 3
    assert watch.faults(("n1", "n2")) == {"n2": (ECC,)}
    assert gpu_faults(watch.faults(("n2",))) == {"n2": ("GPU 0 has 2 uncorrectable ECC errors "
                                                        "(gpu0_ecc_uncorrectable 2, threshold 0)",)}
    (alert,) = detections(watch.faults(("n2",)))
    assert (alert["metric"], alert["value"], alert["threshold"], alert["nodes"]) == (ECC.check, "2", "0", ["n2"])
    assert all(e["type"] == ev.HEALTH for e in journal)


UNREADABLE = HealthItem("fatal", "fs_checkpoint", "unreadable", "readable", "the checkpoint filesystem cannot be read",
                        "check the mount")


def test_a_full_filesystem_blames_no_node_even_before_its_peers_report() -> None:
    """The first agent to see a shared full disk reported it alone; it was blamed and its node excluded. Space is
    alerted and journaled, never a node's fault."""
    watch, journal, table = _watch(("n1", "n2"))
    news: list[tuple[str, tuple[HealthItem, ...]]] = []
    watch.on_news = lambda node, items: news.append((node, items))
    table.report("n1", FULL)
    watch.update(table)
    assert watch.faults(("n1",)) == {} and journal[-1]["node"] == "n1"
    assert news == [("n1", (FULL,))]  # the L3 alert still goes out
    table.report("n2", FULL, ECC)
    watch.update(table)
    assert watch.faults(("n1", "n2")) == {"n2": (ECC,)}
    assert news[1:] == [("n2", (ECC,))]  # the shared full disk is alerted once, not once per node


def test_a_shortage_of_space_is_alerted_again_only_after_every_node_reported_it_gone() -> None:
    watch, journal, table = _watch(("n1", "n2"))
    news: list[tuple[str, tuple[HealthItem, ...]]] = []
    watch.on_news = lambda node, items: news.append((node, items))
    table.report("n1", FULL)
    table.report("n2", FULL)
    watch.update(table)
    table.report("n1")
    watch.update(table)
    table.report("n1", FULL)  # n2 still reports it: the same shortage, already alerted
    watch.update(table)
    assert news == [("n1", (FULL,))] and len(journal) == 4  # every node's change is journaled
    table.report("n1")
    table.report("n2")
    watch.update(table)
    table.report("n2", FULL)  # cleared everywhere, then back: a new shortage
    watch.update(table)
    assert news == [("n1", (FULL,)), ("n2", (FULL,))]


def test_an_unreadable_mount_on_every_node_is_the_shared_filesystems_on_one_node_its_own() -> None:
    watch, _, table = _watch(("n1", "n2"))
    table.report("n1", UNREADABLE)
    watch.update(table)
    assert watch.faults(("n1",)) == {"n1": (UNREADABLE,)}  # only n1 has reported yet: its own mount
    table.report("n2", UNREADABLE)
    watch.update(table)
    assert watch.faults(("n1", "n2")) == {}


# ------------------------------------------------------------------------------------------- in the loop

NODES = ("n1", "n2", "n3")
JOB = "7"
DONE = Launch(0, ranks={"state": "exited", "exit_code": 0})


class LateFault(FakeLauncher):
    """n2's agent reports the fault once the training runs (so the preflight before it found nothing)."""

    def __call__(self, argv: Any, env: Any, log_path: Path, cwd: str | None = None) -> Any:
        proc = super().__call__(argv, env, log_path, cwd)
        if any(a.startswith("--job-name=train-1") for a in argv):
            self.channel.table.health["n2"] = (time.time(), HealthReport("ok", (ECC,)))
        return proc


def _supervise(tmp_path: Path, launches: list[Launch], *, nodes: tuple[str, ...] = NODES, spares: int = 1,
               unfit: tuple[str, ...] = (), launcher_cls: type[FakeLauncher] = FakeLauncher,
               slow: dict[str, float] | None = None, **config: Any) -> tuple[int, list[dict[str, Any]], FakeLauncher]:
    root = tmp_path / "campaign"
    root.mkdir()
    spec = CampaignSpec(command=("python", "train.py"), python="python3")
    env = SlurmEnv(job_id=JOB, nodelist=nodes, tasks_per_node=(1,), restart_count=0, node_name="n1")
    channel = FakeChannel(JOB)
    job = JobInfo(job_id=JOB, state="RUNNING", base_state="RUNNING", nodes=nodes, batch_host="n1",
                  end_time=int(time.time()) + 3600)  # fmt: skip
    slurm = FakeSlurm(job, nodes, channel)
    launcher = launcher_cls(channel, nodes, 1, launches)
    launcher.preflight_compute.update(slow or {})
    for node in unfit:  # the agent's first check found the fault
        channel.table.health[node] = (1.0, HealthReport("ok", (ECC,)))
    cfg = Config(run=RunConfig(spare_nodes=spares, checkpoint_dir=str(tmp_path / "ckpt"), health_interval_s=10.0),
                 **config)  # fmt: skip
    sup = Attempt(CampaignPaths(root), spec, cfg, env, slurm, channel_factory=lambda *a: channel,
                     start_step=launcher, inbox=FakeInbox())  # type: ignore[arg-type]  # fmt: skip
    code = sup.run()
    return code, read(sup.paths.journal), launcher


def _of(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in events if e["type"] == kind]


def test_a_node_found_unfit_during_a_launch_ends_it_is_blamed_and_the_next_launch_excludes_it(tmp_path: Path) -> None:
    code, events, launcher = _supervise(tmp_path, [Launch(None), DONE], launcher_cls=LateFault,
                                        health=Limits(fs_min_free_gib=50.0))  # fmt: skip
    assert code == 0
    agent_argv = launcher.argvs[0]
    assert "supervisor.agent" in agent_argv
    for flag in ("--health-interval=10", f"--health-fs=campaign={tmp_path / 'campaign'}",
                 f"--health-fs=checkpoint={tmp_path / 'ckpt'}", "--health-limit=fs_min_free_gib=50.0"):  # fmt: skip
        name, value = flag.split("=", 1)
        assert value in [agent_argv[i + 1] for i, a in enumerate(agent_argv) if a == name], flag
    assert [(e["node"], e["unfit"]) for e in _of(events, ev.HEALTH)] == [("n2", True)]
    first = _of(events, ev.INTERRUPTION)[0]
    assert first["class"] == ev.HARDWARE and first["blamed_nodes"] == ["n2"]
    assert any("gpu0_ecc_uncorrectable 2, threshold 0" in line for line in first["evidence"])
    launches = _of(events, ev.STEP_LAUNCHED)
    assert [e["nodes"] for e in launches] == [["n1", "n2"], ["n1", "n3"]] and launches[1]["excluded"] == ["n2"]
    assert policy.RESTART_IN_ALLOCATION in [e["kind"] for e in _of(events, ev.ACTION)]
    assert events[-1]["type"] == ev.CAMPAIGN_ENDED and events[-1]["state"] == "completed"
    # the preflight measured every node once (the relaunch's nodes were measured already: auto skips it)
    assert launcher.preflight_runs == [["n1", "n2", "n3"]]
    assert [p["skipped"] for p in _of(events, ev.PREFLIGHT)] == [None, "these nodes were measured earlier in this "
                                                                        "Slurm run"]  # fmt: skip


def test_a_node_unfit_before_the_launch_never_receives_the_training(tmp_path: Path) -> None:
    code, events, launcher = _supervise(tmp_path, [DONE], unfit=("n2",))
    assert code == 0
    (check,) = _of(events, ev.PREFLIGHT)
    assert check["blamed_nodes"] == ["n2"] and check["unfit"] == ["n2"] and check["enough"]
    assert check["unfit_checks"] == {"n2": [ECC.check]} and check["duration_s"] >= 0
    assert launcher.preflight_runs == [["n1", "n3"]]  # the unfit node is not even measured
    (launch,) = _of(events, ev.STEP_LAUNCHED)
    assert launch["nodes"] == ["n1", "n3"] and launch["excluded"] == ["n2"]
    assert [e["class"] for e in _of(events, ev.INTERRUPTION)] == [ev.COMPLETED]


def test_a_markedly_slow_node_is_swapped_for_the_spare(tmp_path: Path) -> None:
    code, events, _ = _supervise(tmp_path, [DONE], slow={"n1": 0.05})
    assert code == 0
    (check,) = _of(events, ev.PREFLIGHT)
    assert check["blamed_nodes"] == ["n1"] and "compute 50.0 ms vs 10.0 ms" in check["slow"]["n1"]
    assert _of(events, ev.STEP_LAUNCHED)[0]["nodes"] == ["n2", "n3"]


def test_without_a_spare_an_unfit_node_means_a_requeue_without_it_and_no_launch(tmp_path: Path) -> None:
    code, events, launcher = _supervise(tmp_path, [], nodes=("n1", "n2"), spares=0, unfit=("n2",))
    assert code == 0  # requeued
    assert not _of(events, ev.STEP_LAUNCHED) and not [a for a in launcher.argvs if "train.py" in a]
    (interruption,) = _of(events, ev.INTERRUPTION)
    assert interruption["class"] == ev.HARDWARE and interruption["blamed_nodes"] == ["n2"]
    requeue = next(e for e in _of(events, ev.ACTION) if e["kind"] == policy.REQUEUE)
    assert requeue["params"]["exclude"] == ["n2"]
    assert _of(events, ev.ATTEMPT_ENDED)[-1]["outcome"]["class"] == ev.HARDWARE


def test_preflight_off_skips_the_test_but_still_leaves_known_unfit_nodes_out(tmp_path: Path) -> None:
    code, events, launcher = _supervise(tmp_path, [DONE], unfit=("n3",), preflight=PreflightConfig(enabled=False))
    assert code == 0 and launcher.preflight_runs == []
    (check,) = _of(events, ev.PREFLIGHT)
    assert check["skipped"] == "preflight.enabled = false" and check["blamed_nodes"] == ["n3"]
    assert _of(events, ev.STEP_LAUNCHED)[0]["nodes"] == ["n1", "n2"]


def test_an_inconclusive_measurement_blames_nobody_and_a_missing_torch_is_found_once(tmp_path: Path) -> None:
    from supervisor.driver.prelaunch import Prelaunch
    from supervisor.health.preflight import PreflightConfig, Verdict

    calls: list[list[str]] = []

    def runner(nodes: list[str], work_dir: Path, **kw: Any) -> Verdict:
        calls.append(nodes)
        (work_dir / "preflight-x").mkdir()  # its files are removed afterwards
        return Verdict(False, True, errors={n: "ModuleNotFoundError: No module named 'torch'" for n in nodes})

    journal: list[dict[str, Any]] = []
    channel = FakeChannel(JOB)
    ctx = Context.of(journal.append)
    pre = Prelaunch(ctx, config=PreflightConfig(enabled=True), health=HealthWatch(ctx, NODES), channel=channel,
                    work_dir=tmp_path / "pf", python="python3", env={}, start=FakeLauncher(channel, NODES, 1, []),
                    log_dir=tmp_path, runner=runner)  # type: ignore[arg-type]  # fmt: skip
    first = pre.check(NODES, (), 2, 1)
    assert first.enough and first.excluded == () and first.blamed == {}
    assert not list((tmp_path / "pf").iterdir())
    second = pre.check(NODES, ("n3",), 2, 2)
    assert second.excluded == ("n3",) and calls == [list(NODES)]
    assert "torch is not importable" in (journal[-1]["skipped"] or "")
    assert journal[0]["errors"]["n1"].endswith("No module named 'torch'") and journal[0]["blamed_nodes"] == []


def test_a_relaunch_measures_again_the_nodes_a_verdict_could_have_hurt_and_only_then(tmp_path: Path) -> None:
    """"auto" skips nodes measured earlier in the Slurm run, except those blamed since for a hang, a hardware
    fault, a node failure or a communication error (the fault may have left them slow); an app error or a
    preemption hurts no node. The spares the training can do without reach the judgement."""
    from supervisor.driver.prelaunch import Prelaunch
    from supervisor.health.preflight import PreflightConfig, Verdict

    calls: list[tuple[list[str], int]] = []

    def runner(nodes: list[str], work_dir: Path, **kw: Any) -> Verdict:
        calls.append((nodes, kw["spares"]))
        return Verdict(True, False, figures={n: {"compute_s": 0.1} for n in nodes})

    journal: list[dict[str, Any]] = []
    channel = FakeChannel(JOB)
    ctx = Context.of(journal.append)
    pre = Prelaunch(ctx, config=PreflightConfig(enabled="auto"), health=HealthWatch(ctx, NODES), channel=channel,
                    work_dir=tmp_path / "pf", python="python3", env={}, start=FakeLauncher(channel, NODES, 1, []),
                    log_dir=tmp_path, runner=runner, health_enabled=False)  # type: ignore[arg-type]  # fmt: skip
    pre.check(NODES, (), 2, 1)
    pre.after(ev.APP_ERROR, ["n2"])
    pre.check(NODES, (), 2, 2)
    assert calls == [(list(NODES), 1)] and journal[-1]["skipped"]  # nothing hurt: not measured again
    pre.after(ev.HANG, ["n2"])
    pre.check(NODES, (), 2, 3)
    assert calls[-1] == (list(NODES), 1) and journal[-1]["retested"] == ["n2"]
    pre.check(NODES, (), 2, 4)
    assert len(calls) == 2 and journal[-1]["retested"] == []  # measured again once, not at every launch


def test_stopped_ranks_are_asked_for_stacks_too_and_a_silent_agent_is_said(tmp_path: Path, monkeypatch) -> None:
    """Before the kill every live or stopped rank is asked (the agent uses py-spy --nonblocking for a stopped
    one); a rank whose agent never answers is journaled without a stack, after a bounded wait."""
    from supervisor.driver import actuators

    monkeypatch.setattr(actuators, "STACKS_WAIT_S", 0.5)

    class Quiet(FakeChannel):
        def send(self, node: str, cmds: Any) -> bool:
            if node == "n2":  # this agent never answers
                self.sent.append((node, list(cmds)))
                return True
            return super().send(node, cmds)

    hung = Launch(None, ranks={"state": "stopped", "phase": "step", "beat_age_s": 5000.0})
    root = tmp_path / "campaign"
    root.mkdir()
    nodes = ("n1", "n2")
    channel = Quiet(JOB)
    job = JobInfo(job_id=JOB, state="RUNNING", base_state="RUNNING", nodes=nodes, batch_host="n1",
                  end_time=int(time.time()) + 3600)  # fmt: skip
    slurm = FakeSlurm(job, nodes, channel)
    launcher = FakeLauncher(channel, nodes, 1, [hung, DONE])
    sup = Attempt(CampaignPaths(root), CampaignSpec(command=("python", "t.py"), python="python3"),
                     Config(preflight=PreflightConfig(enabled=False)), SlurmEnv(job_id=JOB, nodelist=nodes, tasks_per_node=(1,),
                     restart_count=0, node_name="n1"), slurm, channel_factory=lambda *a: channel, start_step=launcher,
                     inbox=FakeInbox())  # type: ignore[arg-type]  # fmt: skip
    assert sup.run() == 0
    stacks = [(e["node"], e["rank"], e["result"]) for e in _of(read(sup.paths.journal), ev.STACKS)]
    assert stacks == [("n1", 0, "stacks_saved"), ("n2", 1, "stacks_failed")]
    (why,) = [e["detail"] for e in _of(read(sup.paths.journal), ev.STACKS) if e["result"] == "stacks_failed"]
    assert why == "no answer from the node's agent within 0.5 s"


def test_new_problems_are_alerted_with_their_figures_once() -> None:
    from fakes import recording_notifier

    from supervisor import alerts

    journal: list[dict[str, Any]] = []
    sent: list[alerts.Alert] = []
    notifier = recording_notifier(journal, sent)
    watch, _, table = _watch()
    watch.on_news = notifier.health
    table.report("n2", HOT)
    watch.update(table)
    table.report("n2", HOT, ECC)  # only the ECC errors are news
    watch.update(table)
    table.report("n2", HOT, ECC)
    watch.update(table)
    table.report("n3", FULL)  # fatal, but a full disk is not hardware
    watch.update(table)
    assert [(a.tier, a.cls, a.nodes, a.metric, a.value, a.threshold) for a in sent] == [
        ("L2", "health", ("n2",), HOT.check, "93C", "90C"),
        ("L3", "hardware", ("n2",), ECC.check, "2", "0"),
        ("L3", "health", ("n3",), FULL.check, "1.0GiB", "5.0GiB"),
    ]
    assert all(a.empty_fields() == [] for a in sent) and sent[1].suggested_action == ECC.fix
    assert [a.action_taken for a in sent] == ["journaled", "node left out of the next launch", "journaled"]
    assert [e["tier"] for e in journal if e["type"] == ev.ACTION] == ["L2", "L3", "L3"]
    notifier.close()

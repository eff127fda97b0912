"""The agents' health reports in the supervisor: journaled when they change, a fatal finding makes its node unfit
(for the rest of the Slurm run), a shared filesystem blames nobody; in the real loop (fakes around it) an unfit
node of the launch ends the launch as a hardware interruption blaming it, and the next launch excludes it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fakes import FakeChannel, FakeInbox, FakeLauncher, FakeSlurm, Launch

from slurm.env import SlurmEnv
from slurm.model import JobInfo
from supervisor.campaign import CampaignPaths, CampaignSpec
from supervisor.config import Config, RunConfig
from supervisor.decisions import events as ev
from supervisor.decisions import policy
from supervisor.driver.health import HealthWatch, detections, gpu_faults
from supervisor.driver.loop import Supervisor
from supervisor.heartbeat.wire import HealthItem, HealthReport
from supervisor.journal import read

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
    return HealthWatch(journal.append, lambda: 5.0, nodes), journal, Table()


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


def test_a_filesystem_full_on_every_node_is_the_shared_filesystems_not_theirs() -> None:
    watch, _, table = _watch(("n1", "n2"))
    table.report("n1", FULL)
    watch.update(table)
    assert watch.faults(("n1",)) == {"n1": (FULL,)}  # only n1 has reported yet: its own disk
    table.report("n2", FULL, ECC)
    watch.update(table)
    assert watch.faults(("n1", "n2")) == {"n2": (ECC,)}


# ------------------------------------------------------------------------------------------- in the loop

NODES = ("n1", "n2", "n3")
JOB = "7"


def test_an_unfit_node_ends_the_launch_is_blamed_and_the_next_launch_excludes_it(tmp_path: Path) -> None:
    root = tmp_path / "campaign"
    root.mkdir()
    spec = CampaignSpec(command=("python", "train.py"), python="python3")
    env = SlurmEnv(job_id=JOB, nodelist=NODES, tasks_per_node=(1,), restart_count=0, node_name="n1")
    channel = FakeChannel(JOB)
    job = JobInfo(job_id=JOB, state="RUNNING", base_state="RUNNING", nodes=NODES, batch_host="n1",
                  end_time=int(time.time()) + 3600)  # fmt: skip
    slurm = FakeSlurm(job, NODES, channel)
    launcher = FakeLauncher(channel, NODES, 1, [Launch(None), Launch(0, ranks={"state": "exited", "exit_code": 0})])
    config = Config(run=RunConfig(spare_nodes=1, checkpoint_dir=str(tmp_path / "ckpt"), health_interval_s=10.0),
                    health={"fs_min_free_gib": 50})  # fmt: skip
    channel.table.health["n2"] = (1.0, HealthReport("ok", (ECC,)))  # n2's agent found the fault at start
    sup = Supervisor(CampaignPaths(root), spec, config, env, slurm, channel_factory=lambda *a: channel,
                     start_step=launcher, inbox=FakeInbox())  # type: ignore[arg-type]  # fmt: skip
    assert sup.run() == 0
    events = read(sup.paths.journal)
    agent_argv = launcher.argvs[0]
    assert "supervisor.agent" in agent_argv
    for flag in ("--health-interval=10", f"--health-fs=campaign={root}", f"--health-fs=checkpoint={tmp_path / 'ckpt'}",
                 "--health-limit=fs_min_free_gib=50.0"):  # fmt: skip
        name, value = flag.split("=", 1)
        assert value in [agent_argv[i + 1] for i, a in enumerate(agent_argv) if a == name], flag
    health = [e for e in events if e["type"] == ev.HEALTH]
    assert [(e["node"], e["unfit"]) for e in health] == [("n2", True)]
    first = next(e for e in events if e["type"] == ev.INTERRUPTION)
    assert first["class"] == ev.HARDWARE and first["blamed_nodes"] == ["n2"]
    assert any("gpu0_ecc_uncorrectable 2, threshold 0" in line for line in first["evidence"])
    launches = [e for e in events if e["type"] == ev.STEP_LAUNCHED]
    assert [e["nodes"] for e in launches] == [["n1", "n2"], ["n1", "n3"]] and launches[1]["excluded"] == ["n2"]
    kinds = [e["kind"] for e in events if e["type"] == ev.ACTION]
    assert policy.RESTART_IN_ALLOCATION in kinds
    assert events[-1]["type"] == ev.CAMPAIGN_ENDED and events[-1]["state"] == "completed"

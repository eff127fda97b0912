"""`srun torchrun` under the supervisor: one torchrun per node (2 nodes x 2 workers), c10d rendezvous on the
launch's MASTER_ADDR:MASTER_PORT from the supervisor's PET_* defaults (the command names no rendezvous flag).
The agents find the workers (grandchildren of the srun task) under their global RANK; a killed worker and a
hung worker are handled as with plain srun, and the run resumes from its checkpoints."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from campaign_tools import EXAMPLE, Campaign, cancel, launches, supervise, wait_for

pytest.importorskip("torch")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

START_TIMEOUT = 180  # 2 torchruns rendezvous, 4 workers import torch on 2 shared cores


def _ppid(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[-1].split()[1])


def _cmdline(pid: int) -> str:
    return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")


def worker(camp: Campaign, rank: int, min_step: int) -> dict | None:
    """The live row of ``rank`` if it is a running worker now (a relaunch may move ranks to other nodes: the
    row an earlier launch left on another node is not it)."""
    for row in camp.live().get("ranks", []):
        if row.get("rank") == rank and (row.get("step") or 0) >= min_step and row.get("state") in ("sleeping", "running"):
            try:
                if "train_ddp" in _cmdline(int(row["pid"])):
                    return dict(row)
            except OSError:
                continue
    return None


def all_ranks(camp: Campaign, min_step: int) -> list[dict] | None:
    rows = [worker(camp, k, min_step) for k in range(4)]
    return rows if all(rows) else None  # type: ignore[return-value]


def test_two_nodes_two_workers_killed_then_hung_worker_resume(tmp_path):
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    cfg = tmp_path / "supervise.toml"
    cfg.write_text(f'[run]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_grace_s = 20\n')
    out = supervise(
        "submit", "--nodes=2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--config", str(cfg),
        "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        str(EXAMPLE), "--steps", "40", "--ckpt-dir", str(ckpt), "--ckpt-every", "10", "--step-time", "0.3",
    )  # fmt: skip
    camp = Campaign(out.stdout.split()[1], root, ckpt)
    try:
        rows = wait_for("4 workers past step 12", lambda: all_ranks(camp, 12), START_TIMEOUT)
        assert sorted(r["rank"] for r in rows) == [0, 1, 2, 3]
        nodes = launches(camp)[0]["nodes"]  # whichever two nodes Slurm allocated (a busy cluster picks others)
        assert len(nodes) == 2 and sorted(r["node"] for r in rows) == sorted([*nodes, *nodes])
        for row in rows:  # each rank is a worker, its parent is torchrun (the srun task), not the task itself
            assert "torch.distributed.run" in _cmdline(_ppid(int(row["pid"])))
        first = launches(camp)[0]
        host, port = first["master"].rsplit(":", 1)
        env = dict(kv.split("=", 1) for kv in open(f"/proc/{rows[0]['pid']}/environ").read().split("\0") if "=" in kv)
        assert env["PET_RDZV_ENDPOINT"] == f"{host}:{port}" and env["PET_MAX_RESTARTS"] == "0"

        os.kill(int(rows[3]["pid"]), signal.SIGKILL)  # a killed worker
        second = wait_for("a relaunch after the killed worker", lambda: launches(camp)[1:] or None, 90)[0]
        assert second["resume_step"] and second["resume_step"] >= 10 and second["master"] != first["master"]
        start = second["resume_step"]
        row = wait_for("rank 1 training again", lambda: worker(camp, 1, start + 3)
                       if len(launches(camp)) == 2 else None, START_TIMEOUT)  # fmt: skip
        os.kill(int(row["pid"]), signal.SIGSTOP)  # a hung worker
        third = wait_for("a relaunch after the hung worker", lambda: launches(camp)[2:] or None, 90)[0]
        assert third["resume_step"] and third["resume_step"] >= start
        ended = wait_for("the campaign to complete", camp.ended, 300)
        assert ended["state"] == "completed"
        interruptions = camp.of_type("interruption")
        classes = [e["class"] for e in interruptions]
        assert classes[1] == "hang" and classes[-1] == "completed" and len(classes) == 3, classes
        killed = f"rank 3 on {rows[3]['node']} was killed by SIGKILL"  # from torchrun's summary, not gloo's errors
        assert interruptions[0]["evidence"][0].startswith(killed), interruptions[0]
        assert camp.report()["attempts"][0]["job_id"] == camp.job_id
    finally:
        cancel(camp.job_id)


def _slurm_job(job_id: str):  # type: ignore[no-untyped-def]
    from slurm.cli_backend import CliSlurmClient

    return CliSlurmClient().job(job_id)


@pytest.mark.timeout(600)  # two launches of 4 workers importing torch on 2 shared cores
def test_a_lost_node_under_torchrun_is_excluded_and_the_spare_resumes_from_the_newest_checkpoint(
        tmp_path, crashable_cluster):  # fmt: skip
    """2 nodes x 2 workers + 1 spare; a node that is not the batch host is crashed (slurmd and its step trees
    SIGKILLed, as test_node_loss.py does): node loss verdict, the node excluded, the relaunch on the spare
    resumes from the newest valid checkpoint, and the run completes."""
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    cfg = tmp_path / "supervise.toml"
    cfg.write_text(f'[preflight]\nenabled = false\n[run]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_grace_s = 20\n'
                   "spare_nodes = 1\n")  # fmt: skip
    out = supervise(
        "submit", "--nodes=2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--config", str(cfg),
        "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        str(EXAMPLE), "--steps", "70", "--ckpt-dir", str(ckpt), "--ckpt-every", "10", "--step-time", "0.3",
    )  # fmt: skip
    camp = Campaign(out.stdout.split()[1], root, ckpt)
    try:
        wait_for("4 workers past step 22", lambda: all_ranks(camp, 22), START_TIMEOUT)
        nodes = launches(camp)[0]["nodes"]
        assert len(_slurm_job(camp.job_id).nodes) == 3 and len(nodes) == 2  # N+K allocated, N train
        batch = _slurm_job(camp.job_id).batch_host
        victim = next(n for n in nodes if n != batch)
        committed = wait_for("checkpoint 20 committed", lambda: max(
            (e["step"] for e in camp.of_type("checkpoint_committed") if e["step"] >= 20), default=None), 60)
        crashable_cluster.crash_node(victim)
        relaunch = wait_for("the relaunch on the spare", lambda: launches(camp)[1:] or None, 90)[0]
        verdict = next(e for e in camp.of_type("node_loss_verdict") if e["verdict"] == "lost")
        assert victim in verdict["nodes"], verdict
        interruption = camp.of_type("interruption")[0]
        assert interruption["class"] == "node_failure" and interruption["blamed_nodes"] == [victim], interruption
        assert victim not in relaunch["nodes"] and len(relaunch["nodes"]) == 2 and relaunch["resume_from"]
        # the newest valid checkpoint: at least the newest one journaled before the crash (a later one may have
        # been written before the crash and found at the relaunch), a periodic one (every 10 steps)
        assert relaunch["resume_step"] >= committed and relaunch["resume_step"] % 10 == 0, (committed, relaunch)
        start = relaunch["resume_step"]
        resumed = wait_for("4 workers of the relaunch training", lambda: all_ranks(camp, start + 2)
                           if len(launches(camp)) == 2 else None, START_TIMEOUT)  # fmt: skip
        assert {r["node"] for r in resumed} == set(relaunch["nodes"])
        ended = wait_for("the campaign to complete", camp.ended, 300)
        assert ended["state"] == "completed", ended
        assert [e["class"] for e in camp.of_type("interruption")] == ["node_failure", "completed"]
        assert len(camp.of_type("attempt_started")) == 1  # replaced in the allocation: same Slurm run, no requeue
    finally:
        cancel(camp.job_id)


@pytest.mark.timeout(600)  # two launches of 4 workers importing torch on 2 shared cores
def test_torchruns_own_restarts_when_turned_on_are_seen_and_counted(tmp_path):
    """--max-restarts=1 on the command line (the user's choice beats the supervisor's PET_MAX_RESTARTS=0): a
    killed worker is restarted by torchrun inside the launch (the supervisor does not end the launch for the
    gone worker while torchrun restarts it), and torchrun's restarts are journaled with the launch's end (from
    torchrun's log lines) and counted in the report. Whether torchrun's restart then trains is torch's
    business: on the local cluster the restarted workers failed to build the gloo mesh ("Connection refused"),
    torchrun gave up, and the supervisor relaunched as for any failed launch; the campaign completes."""
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    cfg = tmp_path / "supervise.toml"
    cfg.write_text(f'[preflight]\nenabled = false\n[run]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_grace_s = 20\n')
    out = supervise(
        "submit", "--nodes=2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--config", str(cfg),
        "--", sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=1",
        str(EXAMPLE), "--steps", "50", "--ckpt-dir", str(ckpt), "--ckpt-every", "10", "--step-time", "0.3",
    )  # fmt: skip
    camp = Campaign(out.stdout.split()[1], root, ckpt)
    try:
        rows = wait_for("4 workers past step 12", lambda: all_ranks(camp, 12), START_TIMEOUT)
        old = {int(r["pid"]) for r in rows}
        killed = rows[3]
        torchrun = _ppid(int(killed["pid"]))  # that node's torchrun (the srun task)
        os.kill(int(killed["pid"]), signal.SIGKILL)

        def restarted() -> int | None:  # a new worker of that torchrun while launch 1 still runs
            if len(launches(camp)) != 1:
                return None
            for entry in os.scandir("/proc"):
                try:
                    if entry.name.isdigit() and int(entry.name) not in old and _ppid(int(entry.name)) == torchrun \
                            and "train_ddp" in _cmdline(int(entry.name)):  # fmt: skip
                        return int(entry.name)
                except (OSError, IndexError):
                    continue
            return None

        wait_for("torchrun's new worker, still in launch 1", restarted, 90, poll=0.1)
        ended = wait_for("the campaign to complete", camp.ended, 400)
        assert ended["state"] == "completed", ended
        first = camp.of_type("interruption")[0]
        assert first["launch"] == 1 and first["torchrun_restarts"].get(killed["node"], 0) >= 1, first
        total = sum(sum(e.get("torchrun_restarts", {}).values()) for e in camp.of_type("interruption"))
        report = camp.report()
        assert report["torchrun_restarts"] == total >= 1
        assert report["attempts"][0]["torchrun_restarts"] == first["torchrun_restarts"]
    finally:
        cancel(camp.job_id)

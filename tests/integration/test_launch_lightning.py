"""PyTorch Lightning under the supervisor (examples/train_lightning.py: CPU, 2 nodes, DDP over gloo): a killed
rank is relaunched in the allocation and the run continues from the step of the newest `.ckpt` Lightning saved;
Lightning's own SLURM auto-requeue is off (the supervisor owns requeue)."""

from __future__ import annotations

import os
import signal
import sys

import pytest
from campaign_tools import REPO, Campaign, cancel, launches, live_rank, step_lines, supervise, wait_for

pytest.importorskip("torch")
pytest.importorskip("lightning")
pytestmark = [pytest.mark.slurm, pytest.mark.torch]

EXAMPLE = REPO / "examples" / "train_lightning.py"
START_TIMEOUT = 180  # 2 ranks import torch and Lightning on 2 shared cores


def submit_example(tmp_path, config: str, steps: int, *extra: str) -> Campaign:  # type: ignore[no-untyped-def]
    """The example on 2 nodes x 1 rank, checkpoints every 5 steps into tmp/ckpt, ``config`` after its
    ``[run] checkpoint_dir``."""
    root, ckpt = tmp_path / "campaign", tmp_path / "ckpt"
    cfg = tmp_path / "supervise.toml"
    cfg.write_text(f'[run]\ncheckpoint_dir = "{ckpt}"\n{config}')
    out = supervise(
        "submit", "--nodes=2", "--ntasks-per-node=1", "--time=10", "--campaign", str(root), "--config", str(cfg),
        "--", sys.executable, str(EXAMPLE), "--steps", str(steps), "--ckpt-dir", str(ckpt), "--ckpt-every", "5",
        "--step-time", "0.3", *extra,
    )  # fmt: skip
    return Campaign(out.stdout.split()[1], root, ckpt)


def test_lightning_rank_killed_resumes_from_its_ckpt(tmp_path):
    camp = submit_example(tmp_path, "checkpoint_grace_s = 20\n", 30)
    ckpt = tmp_path / "ckpt"
    try:
        row = wait_for("rank 1 past step 12", lambda: live_rank(camp.root, 1, 12), START_TIMEOUT)
        env = dict(kv.split("=", 1) for kv in open(f"/proc/{row['pid']}/environ").read().split("\0") if "=" in kv)
        assert env["RANK"] == "1" and env["MASTER_PORT"] == launches(camp)[0]["master"].rsplit(":", 1)[1]
        os.kill(int(row["pid"]), signal.SIGKILL)
        second = wait_for("a relaunch", lambda: launches(camp)[1:] or None, 90)[0]
        resumed = second["resume_step"]
        assert resumed and resumed >= 10 and second["resume_from"].endswith(f"step-{resumed:08d}.ckpt")
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed"
        log2 = next(p for p in camp.root.glob("logs/**/train-2.log"))
        text = log2.read_text(errors="replace")
        steps = [int(line.split()[0].split("=")[1]) for line in step_lines(text)]
        assert steps[0] == resumed + 1 and steps[-1] == 30, steps  # continues from the checkpoint's step
        assert "hpc_ckpt" not in " ".join(p.name for p in ckpt.iterdir())  # Lightning's own requeue never ran
    finally:
        cancel(camp.job_id)


def proc_env(pid: int) -> dict[str, str]:
    return dict(kv.split("=", 1) for kv in open(f"/proc/{pid}/environ").read().split("\0") if "=" in kv)


@pytest.mark.parametrize("standbys", ["off", "auto"])
def test_lightning_rank_killed_restarts_warm_the_survivor_keeps_its_process(tmp_path, standbys):
    """The example with ``--restartable`` (a new Trainer per attempt inside ``client.restartable``) and
    ``warm_restart = "on"``: rank 1 SIGKILLed; rank 0 keeps its process and fits again on the supervisor's order,
    rank 1 is started again alone (its own job step, or a standby's process) with Lightning's SLURMEnvironment
    seeing its place in the launch (SLURM_PROCID 1 of SLURM_NTASKS 2, not srun's 0 of 1 for a one-task step), both
    resume from the newest ``.ckpt`` and the campaign completes."""
    camp = submit_example(tmp_path, f'warm_restart = "on"\nstandbys = "{standbys}"\n', 40, "--restartable")
    try:
        if standbys == "auto":
            wait_for("the standbys to start", lambda: camp.of_type("standbys"), START_TIMEOUT)
        victim = wait_for("rank 1 past step 12", lambda: live_rank(camp.root, 1, 12), START_TIMEOUT)
        survivor = int(wait_for("rank 0", lambda: live_rank(camp.root, 0), 30)["pid"])
        os.kill(int(victim["pid"]), signal.SIGKILL)
        again = wait_for("the warm restart", lambda: launches(camp)[1:] or None, 90)[0]
        assert again.get("warm") is True and again["generation"] == 1 and again["replaced_ranks"] == [1], again
        resumed = again["resume_step"]
        assert resumed and resumed >= 10 and again["resume_from"].endswith(f"step-{resumed:08d}.ckpt"), again
        back = wait_for("rank 1 back past the resumed step",
                        lambda: (r := live_rank(camp.root, 1, resumed + 2)) and r["pid"] != victim["pid"] and r, 120)  # fmt: skip
        kept = wait_for("rank 0 past the resumed step", lambda: live_rank(camp.root, 0, resumed + 2), 60)
        assert int(kept["pid"]) == survivor, "rank 0 kept its process"
        taken = again.get("standby_ranks")
        if standbys == "off":  # its own step's task: the values srun left are replaced before the program starts
            assert taken is None, again
            seen = proc_env(int(back["pid"]))
            assert (seen["SLURM_PROCID"], seen["SLURM_NTASKS"], seen["RANK"]) == ("1", "2", "1"), seen
        else:  # a standby's process, assigned in-process (its /proc environ is still the standby's)
            assert list(taken or {}) == ["1"], again
        name = f"train-*-standby-{taken['1']}.log" if taken else "train-*-g1-r1.log"
        new_rank = next(camp.root.glob(f"logs/**/{name}")).read_text(errors="replace")
        assert not step_lines(new_rank), "Lightning there is rank 1 (only rank 0 prints steps), not a world of its own"
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
        assert len(launches(camp)) == 2 and not camp.of_type("warm_restart_skipped")
        assert not [a for a in camp.of_type("action") if a["kind"] == "kill_step"]
        log = next(p for p in camp.root.glob("logs/**/train-1.log")).read_text(errors="replace")
        before, _, after = log.partition("restarting in this process in generation 1")
        assert after, "rank 0 restarted in its process"
        steps = [int(line.split()[0].split("=")[1]) for line in step_lines(after)]
        assert steps[0] == resumed + 1 and steps[-1] == 40, steps  # rank 0 fit again from the checkpoint
    finally:
        cancel(camp.job_id)

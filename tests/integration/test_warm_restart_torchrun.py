"""Warm restart of a ``srun torchrun`` launch on the real local Slurm (issue 23): README's torchrun usage (one
torchrun per node, 3 nodes x 2 workers, the c10d rendezvous from the supervisor's PET_* defaults) with
``[run] warm_restart = "on"`` and the user-style program that wraps its training in ``client.restartable``
(tests/integration/programs/warm_train.py, run by the ``torchrun`` script as users type it).

A worker SIGKILLed: its torchrun stops the node's other worker and exits; the other nodes' torchruns and workers
go on, the workers waiting in their processes. The supervisor starts the dead node's two ranks again as torchrun
would start its workers (``python -u SCRIPT ARGS`` with torchrun's worker variables, each its own one-task step; a
new torchrun would make the others restart their workers), the kept workers rendezvous with them in their
processes, and the campaign completes without waiting out the kept torchruns' 300 s exit barrier, bitwise as an
uninterrupted run. The killed worker is on a node whose torchrun does not host the rendezvous store (that torchrun's
exit would end the others': then the restart is cold, as documented). A kept worker found stuck in its collective
would take its node's group with it (then two nodes are replaced): allowed, and checked to be started again.

With ``[run] standbys = "auto"`` (the default) each node keeps one standby per worker, running torchrun's worker
command (its interpreter, ``-u``, the script): the dead node's ranks are taken by its standbys, which paid the
interpreter's start and ``import torch`` before the fault; with "off" they start as new steps."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from campaign_tools import Campaign, cancel, launches, live_rank, supervise, wait_for
from matrix_tools import rank_pid_on
from test_warm_restart_client import base_env, free_port, start_rank, wait_all

pytestmark = [pytest.mark.slurm, pytest.mark.torch]
PROGRAM = Path(__file__).parent / "programs" / "warm_train.py"
STEPS, NODES, NPROC = 30, 3, 2
WORLD = NODES * NPROC


def parent(pid: int) -> int:
    return psutil.Process(pid).ppid()


def store_host(port: int) -> int | None:
    """The pid listening on the launch's rendezvous port: the torchrun hosting the c10d store."""
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN and conn.pid:
            return int(conn.pid)
    return None


def uninterrupted(tmp: Path, steps: int = STEPS) -> dict[str, torch.Tensor]:
    tmp.mkdir()
    env = {**base_env(tmp, free_port()), "WORLD_SIZE": str(WORLD)}
    wait_all({r: start_rank(r, env, tmp, "plain", steps) for r in range(WORLD)}, tmp)
    return torch.load(tmp / "final.pt", weights_only=True)


@pytest.mark.parametrize("standbys", ["off", "auto"])
def test_a_dead_torchrun_workers_node_restarts_warm_and_the_other_nodes_workers_keep_their_processes(
        tmp_path, standbys: str) -> None:  # type: ignore[no-untyped-def]  # fmt: skip
    root, ckpt, out = tmp_path / "campaign", tmp_path / "ckpt", tmp_path / "final.pt"
    cfg = tmp_path / "supervise.toml"
    cfg.write_text(f'[preflight]\nenabled = false\n[run]\nwarm_restart = "on"\nstandbys = "{standbys}"\n')
    steps = STEPS if standbys == "off" else 2 * STEPS  # (the standbys start once every rank trains: time for them)
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    submitted = supervise("submit", f"--nodes={NODES}", "--ntasks-per-node=1", "--time=10", "--campaign", str(root),
                          "--config", str(cfg), "--", torchrun, f"--nproc-per-node={NPROC}", str(PROGRAM), "--steps",
                          str(steps), "--ckpt-dir", str(ckpt), "--ckpt-every", "5", "--step-time", "0.3", "--out",
                          str(out))  # fmt: skip
    camp = Campaign(submitted.stdout.split()[1], root, ckpt)
    try:
        pids = {r: rank_pid_on(camp, r) for r in range(WORLD)}
        port = int(launches(camp)[0]["master"].rsplit(":", 1)[1])
        host = wait_for("the torchrun hosting the rendezvous store", lambda: store_host(port), 60)
        agents = sorted({parent(pid) for pid in pids.values()} - {host})  # a node's torchrun, not the store's
        victims = sorted(r for r, pid in pids.items() if parent(pid) == agents[0])
        assert len(victims) == NPROC and len(agents) == NODES - 1, (pids, host)
        wait_for("rank 0 at step 10", lambda: live_rank(root, 0, 10), 120)
        if standbys == "auto":  # one per worker on each node, torchrun's worker command (not a torchrun)
            pool = wait_for("the standbys", lambda: camp.of_type("standbys") or None, 60)[0]["started"]
            assert sorted(pool.values()) == sorted(2 * launches(camp)[0]["nodes"]), pool
        os.kill(pids[victims[0]], signal.SIGKILL)
        killed = time.monotonic()
        ended = wait_for("the campaign to complete", camp.ended, 240)
        assert ended["state"] == "completed", ended
        assert time.monotonic() - killed < 150, "the kept torchrun's exit barrier (300 s) was waited out"
        first, again = launches(camp)
        assert first.get("warm") is True, first
        assert again["warm"] is True and again["generation"] == 1, again
        replaced = again["replaced_ranks"]
        assert set(victims) <= set(replaced) and len(replaced) in (NPROC, 2 * NPROC), again  # (a stuck node too)
        kept = sorted(set(pids) - set(replaced))
        assert not camp.of_type("warm_restart_skipped"), camp.of_type("warm_restart_skipped")
        kinds = [a["kind"] for a in camp.of_type("action")]
        assert "kill_step" not in kinds, kinds  # the kept workers' step was never killed
        logs = next(d for d in root.glob("logs/*/") if (d / "train-1.log").exists())
        text = (logs / "train-1.log").read_text(errors="replace")
        for r in kept:  # generation 0 and 1 in the same worker process
            assert f"start rank={r} pid={pids[r]} generation=0 step=0" in text, text[-3000:]
            assert f"start rank={r} pid={pids[r]} generation=1 step={again['resume_step']}" in text, text[-3000:]
        taken = again.get("standby_ranks", {})
        assert sorted(taken) == (sorted(str(r) for r in replaced) if standbys == "auto" else []), again
        for r in replaced:  # started again, without torchrun: a standby, or their own steps
            name = f"train-1-standby-{taken[str(r)]}.log" if taken else f"train-{again['launch']}-g1-r{r}.log"
            started = (logs / name).read_text(errors="replace")
            assert f"start rank={r} " in started and f"generation=1 step={again['resume_step']}" in started, started
        want = uninterrupted(tmp_path / "plain", steps)
        got = torch.load(out, weights_only=True)
        assert all(torch.equal(got[k], want[k]) for k in want), "the warm restart changed the training"
    finally:
        cancel(camp.job_id)

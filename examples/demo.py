"""The demo: a supervised DDP training run on a real local Slurm, with a rank hang and a node crash injected.

    python examples/demo.py [--workdir DIR] [--steps N]

1. brings up the project's local 4-node Slurm (munged, slurmctld, 4 slurmd) if it is not up;
2. submits examples/train_ddp.py on 2 nodes with `supervise submit`;
3. once training runs, stops rank 1 with SIGSTOP (a hung rank): the supervisor detects it, saves the stacks,
   kills the step and relaunches it in the same allocation from the newest valid checkpoint;
4. then crashes the other node of the job (its slurmd, step daemons and ranks are SIGKILLed, as when a
   machine dies): the supervisor sees the node go silent, blames it, and the job is requeued without it;
5. waits for the training to complete and prints `supervise report`.
Everything is real: processes, signals, Slurm. Exit code 0 when the campaign completed after both faults.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from examples.campaign_view import events, job_nodes, live_rank, wait_for  # noqa: E402
from slurm.localcluster import LocalCluster  # noqa: E402
from slurm.localcluster.config import DEFAULT_BASE_PORT  # noqa: E402


def say(text: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {text}", flush=True)


def supervise(*args: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "supervisor.cli", *args], capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"supervise {args[0]} failed: {proc.stderr.strip()}")
    return proc.stdout


def main() -> int:  # noqa: C901 - a script, read top to bottom
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=REPO / "demo-out" / time.strftime("%Y%m%d-%H%M%S"))
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()

    say("bringing up the local Slurm cluster (4 nodes) ...")
    # The cluster the tests use: SUPERVISOR_CLUSTER_BASE_PORT / SUPERVISOR_CLUSTER_SLURM=24 pick a private or 24.11 one.
    cluster = LocalCluster(base_port=int(os.environ.get("SUPERVISOR_CLUSTER_BASE_PORT") or DEFAULT_BASE_PORT))
    cluster.up(timeout=120)
    os.environ.update(cluster.env)  # SLURM_CONF (and PATH to the 24.11 chroot's client wrappers)
    say(f"cluster up: export SLURM_CONF={cluster.conf}")

    root, ckpt = args.workdir / "campaign", args.workdir / "ckpt"
    args.workdir.mkdir(parents=True, exist_ok=True)
    config = args.workdir / "supervise.toml"
    config.write_text(f'[run]\ncheckpoint_dir = "{ckpt}"\ncheckpoint_grace_s = 20\n')
    out = supervise("submit", "--nodes=2", "--ntasks-per-node=1", "--time=15", "--job-name=demo",
                    "--campaign", str(root), "--config", str(config), "--",
                    sys.executable, str(REPO / "examples" / "train_ddp.py"), "--steps", str(args.steps),
                    "--ckpt-dir", str(ckpt), "--ckpt-every", "10", "--step-time", "0.3", "--seed", "1")  # fmt: skip
    job_id = out.split()[1]
    say(f"submitted job {job_id}; campaign {root}")

    try:
        row = wait_for("rank 1 to train past step 25", lambda: live_rank(root, 1, 25), 240)
        say(f"FAULT 1: hanging rank 1 (pid {row['pid']} on {row['node']}) with SIGSTOP at step {row['step']}")
        os.kill(int(row["pid"]), signal.SIGSTOP)
        t0 = time.time()
        relaunch = wait_for("the supervisor to relaunch the step", lambda: [e for e in events(root)
                        if e["type"] == "step_launched" and e["t"] > t0], 90)[0]  # fmt: skip
        say(f"recovered: step relaunched {relaunch['t'] - t0:.1f} s after the hang, resuming from "
            f"{relaunch.get('resume_from')}")

        row = wait_for("the relaunched ranks to train", lambda: live_rank(root, 0, (relaunch.get("resume_step") or 0) + 10),
                   240)  # fmt: skip
        batch, nodes = job_nodes(job_id)
        victim = next((n for n in nodes if n != batch), nodes[-1])
        say(f"FAULT 2: crashing node {victim} (job on {','.join(nodes)}, batch host {batch}) at step {row['step']}")
        cluster.crash_node(victim)
        t1 = time.time()
        started = wait_for("the job to run again without the crashed node", lambda: [e for e in events(root)
                       if e["type"] == "step_launched" and e["t"] > t1], 240)[0]  # fmt: skip
        say(f"recovered: training relaunched on {','.join(started['nodes'])} {started['t'] - t1:.1f} s after the "
            f"crash, resuming from {started.get('resume_from')}")
        ended = wait_for("the training to complete", lambda: [e for e in events(root) if e["type"] == "campaign_ended"],
                     600)[0]  # fmt: skip
        say(f"campaign ended: {ended['state']} ({ended.get('reason', '')})")
    finally:
        for node in cluster.node_names:
            if not cluster.is_usable(cluster.node_states().get(node, "")):
                cluster.revive_node(node)
        cluster.slurm("scancel", job_id)

    print()
    print(supervise("report", str(root)))
    report = json.loads(supervise("report", str(root), "--json"))
    (args.workdir / "report.json").write_text(json.dumps(report, indent=2))
    classes = [a["outcome"]["class"] for a in report["attempts"] if a["outcome"]]
    ok = report["state"] == "completed" and "hang" in classes and "node_failure" in classes
    say(f"outcomes: {classes}; report saved to {args.workdir / 'report.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

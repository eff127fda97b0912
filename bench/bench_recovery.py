"""Recovery speed on the real local Slurm: supervised vs Slurm and torch defaults, side by side in one run.

    python bench/bench_recovery.py [--quick]

Figures (the example training, 2 nodes x 1 rank, gloo on CPU):
  A. hang (SIGSTOP of rank 1, 1 s steps) -> every rank stopped with stacks saved.
     Baseline: the same training under plain sbatch/srun; we watch for --baseline-window seconds whether Slurm,
     srun or torch notice anything (they do not: a stopped rank holds a TCP connection open; gloo's default
     collective timeout is 30 min, NCCL's 10 min, and Slurm never looks at progress).
  B. rank SIGKILL -> first resumed training step, supervised (restart in the allocation).
  C. node crash -> first resumed training step, supervised (requeue without the node) vs plain
     `sbatch --requeue` (Slurm requeues after marking the node DOWN; the script resumes from its checkpoints).
Each prints seconds and the ratio baseline / supervised. Goals (issue 5): A <= 10 s, B <= 20 s, C <= 60 s.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from examples.campaign_view import events, job_nodes, live_rank, wait_for  # noqa: E402
from slurm.localcluster import LocalCluster  # noqa: E402

EXAMPLE = REPO / "examples" / "train_ddp.py"
STEP = re.compile(r"^(?:\s*\d+: )?step=(\d+) ", re.M)  # the supervisor's launch logs carry srun --label's "N: "


def supervise_submit(work: Path, steps: int, step_time: float) -> tuple[str, Path]:
    root, ckpt = work / "campaign", work / "ckpt"
    work.mkdir(parents=True, exist_ok=True)
    (work / "c.toml").write_text(f'[run]\ncheckpoint_dir = "{ckpt}"\n')
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "submit", "-N", "2", "--ntasks-per-node=1", "--time=15",
         "--campaign", str(root), "--config", str(work / "c.toml"), "--", sys.executable, str(EXAMPLE),
         "--steps", str(steps), "--ckpt-dir", str(ckpt), "--ckpt-every", "5", "--step-time", str(step_time)],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout  # fmt: skip
    return out.split()[1], root


def plain_submit(cluster: LocalCluster, work: Path, steps: int, step_time: float) -> tuple[str, Path]:
    """The baseline: Slurm and torch defaults only (`sbatch --requeue`, srun, the same resumable training)."""
    work.mkdir(parents=True, exist_ok=True)
    out = work / "slurm.out"
    script = work / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"srun {sys.executable} {EXAMPLE} --steps {steps} --ckpt-dir {work / 'ckpt'} --ckpt-every 5 "
        f"--step-time {step_time}\n"
    )
    got = cluster.slurm("sbatch", "--parsable", "--requeue", "-N", "2", "--ntasks-per-node=1", "--time=15",
                        "--open-mode=append", "-o", str(out), str(script))  # fmt: skip
    return got.stdout.strip().split(";")[0], out


def rank_pid_of_plain(job: str, node: str) -> int:
    """The pid of the training rank of a plain job on ``node`` (no live table there): its environment says."""
    want = {f"SLURM_JOB_ID={job}".encode(), f"SLURMD_NODENAME={node}".encode()}
    for _ in range(120):
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if b"train_ddp.py" not in (proc / "cmdline").read_bytes():
                    continue
                if want <= set((proc / "environ").read_bytes().split(b"\0")):
                    return int(proc.name)
            except OSError:
                continue
        time.sleep(1)
    raise SystemExit(f"no training rank found for job {job} on {node}")


def first_step_after(path_glob: Path, pattern: str, since_bytes: dict[Path, int], min_step: int, timeout: float,
                     marker: str = "") -> float:
    """Wall time when a step line >= min_step first appears in new output of the matching files (after
    ``marker``, e.g. the training's "resumed from" line, when given)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for path in path_glob.glob(pattern):
            try:
                data = path.read_bytes()[since_bytes.get(path, 0):].decode(errors="replace")
            except OSError:
                continue
            if marker:
                at = data.find(marker)
                data = "" if at < 0 else data[at:]
            if any(int(m) >= min_step for m in STEP.findall(data)):
                return time.time()
        time.sleep(0.2)
    raise SystemExit(f"no training step >= {min_step} in {path_glob}/{pattern} within {timeout:.0f} s")


def bench_hang(cluster: LocalCluster, work: Path, window: float) -> tuple[float, float | None]:
    job, root = supervise_submit(work / "hang", steps=400, step_time=1.0)
    try:
        row = wait_for("rank 1 warmed up", lambda: live_rank(root, 1, 25), 300)
        t0 = time.time()
        os.kill(int(row["pid"]), signal.SIGSTOP)
        acted = wait_for("the step killed", lambda: [e for e in events(root, "action")
                         if e["kind"] in ("restart_in_allocation", "requeue", "stop") and e["t"] > t0], 120)  # fmt: skip
        stacks = [e for e in events(root, "stacks") if e["t"] > t0 and e["result"] == "stacks_saved"]
        ours = acted[0]["t"] - t0
        print(f"A  supervised: hang -> every rank stopped, {len(stacks)} stack dumps saved: {ours:.1f} s")
    finally:
        cluster.slurm("scancel", job)
    # Baseline: plain job, same hang, watch whether anything reacts within the window.
    bjob, out = plain_submit(cluster, work / "hang-plain", steps=400, step_time=1.0)
    try:
        batch, nodes = wait_for("the plain job to run", lambda: job_nodes(bjob)[1] and job_nodes(bjob), 120)
        victim = next(n for n in nodes if n != batch)
        pid = rank_pid_of_plain(bjob, victim)
        wait_for("plain training to run", lambda: len(STEP.findall(out.read_text(errors="replace"))) > 10
                 if out.exists() else None, 300)  # fmt: skip
        os.kill(pid, signal.SIGSTOP)
        t0 = time.monotonic()
        noticed = None
        while time.monotonic() - t0 < window:
            state = cluster.slurm("squeue", "-h", "-j", bjob, "-o", "%T").stdout.strip()
            if state not in ("RUNNING", ""):
                noticed = time.monotonic() - t0
                break
            time.sleep(1)
        os.kill(pid, signal.SIGCONT)
    finally:
        cluster.slurm("scancel", bjob)
    if noticed is None:
        print(f"A  baseline (Slurm + torch defaults): nothing noticed within {window:.0f} s "
              f"(gloo default timeout 1800 s); ratio > {window / ours:.0f}x")  # fmt: skip
    else:
        print(f"A  baseline: noticed after {noticed:.0f} s; ratio {noticed / ours:.1f}x")
    return ours, noticed


def bench_kill(cluster: LocalCluster, work: Path) -> float:
    job, root = supervise_submit(work / "kill", steps=400, step_time=0.3)
    try:
        row = wait_for("rank 1 training", lambda: live_rank(root, 1, 12), 300)
        sizes = {p: p.stat().st_size for p in root.glob("logs/*/train-*.log")}
        t0 = time.time()
        os.kill(int(row["pid"]), signal.SIGKILL)
        seen = first_step_after(root / "logs", "*/train-2.log", sizes, 1, 120)
        ours = seen - t0
        print(f"B  supervised: rank SIGKILL -> first resumed step in the allocation: {ours:.1f} s (goal <= 20 s)")
        return ours
    finally:
        cluster.slurm("scancel", job)


def bench_node_crash(cluster: LocalCluster, work: Path) -> tuple[float, float]:
    job, root = supervise_submit(work / "crash", steps=400, step_time=0.3)
    try:
        wait_for("training", lambda: live_rank(root, 0, 12), 300)
        batch, nodes = job_nodes(job)
        victim = next(n for n in nodes if n != batch)
        t0 = time.time()
        cluster.crash_node(victim)
        seen = first_step_after(root / "logs", "job*-restart1/train-*.log", {}, 1, 240)
        ours = seen - t0
        print(f"C  supervised: node crash -> first resumed step (requeue without {victim}): {ours:.1f} s (goal <= 60 s)")
    finally:
        cluster.slurm("scancel", job)
        cluster.revive_node(victim)
    bjob, out = plain_submit(cluster, work / "crash-plain", steps=400, step_time=0.3)
    try:
        wait_for("plain training", lambda: out.exists() and len(STEP.findall(out.read_text(errors="replace"))) > 12, 300)
        batch, nodes = job_nodes(bjob)
        victim = next(n for n in nodes if n != batch)
        size = {out: out.stat().st_size}
        t0 = time.time()
        cluster.crash_node(victim)
        seen = first_step_after(out.parent, out.name, size, 1, 300, marker="resumed from")
        base = seen - t0
        print(f"C  baseline (sbatch --requeue alone): first resumed step {base:.1f} s; ratio {base / ours:.1f}x")
    finally:
        cluster.slurm("scancel", bjob)
        cluster.revive_node(victim)
    return ours, base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-window", type=float, default=120.0)
    parser.add_argument("--only", choices=("hang", "kill", "crash"))
    args = parser.parse_args()
    cluster = LocalCluster()
    cluster.up(timeout=120)
    os.environ["SLURM_CONF"] = str(cluster.conf)
    with tempfile.TemporaryDirectory(prefix="bench-recovery-", dir=REPO / "bench" / "out"
                                     if (REPO / "bench" / "out").is_dir() else None) as tmp:  # fmt: skip
        work = Path(tmp)
        if args.only in (None, "hang"):
            bench_hang(cluster, work, args.baseline_window)
        if args.only in (None, "kill"):
            bench_kill(cluster, work)
        if args.only in (None, "crash"):
            bench_node_crash(cluster, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Recovery speed on the real local Slurm: supervised vs Slurm and torch defaults, side by side in one run.

    python bench/bench_recovery.py [--only hang|kill|crash|memory|warm|warm-crash|warm-hang|warm-torchrun] [--accounting]

Figures (the example training, 2 nodes x 1 rank, gloo on CPU):
  A. hang (SIGSTOP of rank 1, 1 s steps) -> every rank stopped with stacks saved.
     Baseline: the same training under plain sbatch/srun; we watch for --baseline-window seconds whether Slurm,
     srun or torch notice anything (they do not: a stopped rank holds a TCP connection open; gloo's default
     collective timeout is 30 min, NCCL's 10 min, and Slurm never looks at progress).
  B. rank SIGKILL -> first resumed training step, supervised (restart in the allocation).
  C. node crash -> first resumed training step, four rows measured in the same run (issue 11):
     plain `sbatch --requeue` (Slurm requeues after marking the node DOWN; the script resumes from its
     checkpoints), the supervisor without a spare (our verdict, requeue at once without the node), with one spare
     (`[run] spare_nodes = 1`: replaced inside the allocation, no requeue), and the batch host crashed (with one
     spare: the agents' failsafe requeues; also the time nothing supervised the job).
  M. the memory tier (issue 27): rank SIGKILL and node crash with a spare, memory tier on vs off, DCP every 50
     steps: steps lost and seconds until training is past the pre-fault step again (`--only memory`).
  W. warm restart (issue 23): rank SIGKILL of the example with --restartable: warm with a standby taking the rank,
     warm starting it as a new step, cold relaunch: steps lost, seconds until the first step after the fault and
     until past the pre-fault step again (`--only warm`). `--only warm-torchrun`: the same under `srun torchrun`
     (2 nodes x 2 workers, a worker of the node not hosting torchrun's store killed): warm vs cold side by side.
     `--only warm-hang`: a live hang of rank 1 (alive, outside any collective, --hang-at-step): warm (its stack
     saved, it alone killed, a standby takes it) vs cold, from the hang's start.
Each prints seconds and the ratio baseline / supervised. Goals: A <= 10 s, B <= 20 s; C with a spare <= 10 s,
without <= 20 s, batch host: failsafe within 30 s; M: <= 2 steps lost with the tier on.
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

from bench import crash_timeline  # noqa: E402
from examples.campaign_view import events, job_nodes, live_rank, wait_for  # noqa: E402
from slurm.localcluster import LocalCluster  # noqa: E402
from slurm.localcluster.config import DEFAULT_BASE_PORT  # noqa: E402
from supervisor.decisions.recovery_timings import recoveries  # noqa: E402
from supervisor.report_view import recovery_text  # noqa: E402

EXAMPLE = REPO / "examples" / "train_ddp.py"
STEP = re.compile(r"^(?:\s*\d+: )?step=(\d+) ", re.M)  # the supervisor's launch logs carry srun --label's "N: "


def supervise_submit(work: Path, steps: int, step_time: float, run_config: str = "", ckpt_every: int = 5,
                     nodes: int = 2, extra: tuple[str, ...] = (),
                     launcher: tuple[str, ...] = (sys.executable,)) -> tuple[str, Path]:  # fmt: skip
    root, ckpt = work / "campaign", work / "ckpt"
    work.mkdir(parents=True, exist_ok=True)
    (work / "c.toml").write_text(f'[run]\ncheckpoint_dir = "{ckpt}"\n{run_config}')
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "submit", "-N", str(nodes), "--ntasks-per-node=1", "--time=15",
         "--campaign", str(root), "--config", str(work / "c.toml"), "--", *launcher, str(EXAMPLE),
         "--steps", str(steps), "--ckpt-dir", str(ckpt), "--ckpt-every", str(ckpt_every), "--step-time", str(step_time),
         "--timings", *extra],
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
        f"--step-time {step_time} --timings\n"
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


def training_victim(root: Path, job: str, batch_host: bool = False) -> str:
    """A node of the running launch: the batch host, or one that is not."""
    batch, _ = job_nodes(job)
    nodes = events(root, "step_launched")[-1]["nodes"]
    return batch if batch_host else next(n for n in nodes if n != batch)


def crash_supervised(cluster: LocalCluster, work: Path, label: str, run_config: str = "",
                     batch_host: bool = False, warm: bool = False) -> tuple[float, float | None]:
    """Crash a node of a supervised run; seconds to the first resumed iteration (and to the failsafe). ``warm``:
    the example runs inside client.restartable and warm restart is on; the crash comes once the standbys (one on
    the spare) had ``STANDBY_READY_S`` to import torch."""
    extra = ("--restartable",) if warm else ()
    if warm:
        run_config += 'warm_restart = "on"\n'
    job, root = supervise_submit(work, steps=400, step_time=0.3, run_config=run_config, extra=extra)
    victim = ""
    try:
        wait_for("training", lambda: live_rank(root, 0, 12), 300)
        if warm:
            wait_for("the standbys", lambda: events(root, "standbys") or None, 60)
            time.sleep(STANDBY_READY_S)
        victim = training_victim(root, job, batch_host)
        launched = len(events(root, "step_launched"))
        sizes = {p: p.stat().st_size for p in root.glob("logs/*/train-*.log")}
        states = crash_timeline.SlurmStates(cluster.slurm, job, victim)
        t0 = time.time()
        cluster.crash_node(victim)
        # The next launch's log: a relaunch in this run (train-N+1) or the requeued run's first launch.
        wait_for("the next launch", lambda: len(events(root, "step_launched")) > launched or None, 240)
        log = events(root, "step_launched")[-1]
        restart = events(root, "attempt_started")[-1]["restart"]
        name = log.get("log") or f"train-{log['launch']}.log"  # a warm restart goes on in the launch's log
        pattern = f"job*-restart{restart}/{name}"
        seen = first_step_after(root / "logs", pattern, sizes, 1, 240, marker="resumed from" if warm else "")
        ours = seen - t0
        failsafe = [e["t"] - t0 for e in events(root, "failsafe")]
        how = "failsafe requeue" if batch_host else "requeue" if restart else "relaunch on the spare"
        if log.get("generation"):
            how = "warm restart, " + ("a standby on the spare took the rank" if log.get("standby_ranks") else
                                      "the rank started on the spare")  # fmt: skip
        extra = f"; failsafe acted after {failsafe[0]:.1f} s (nothing supervised the job until then)" if failsafe else ""
        print(f"C  {label}: node crash ({victim}) -> first resumed step ({how}): {ours:.1f} s{extra}", flush=True)
        program = crash_timeline.program_timings([root / "logs" / f"job{job}-restart{restart}" / name])
        print(crash_timeline.render(label, crash_timeline.marks(t0, events(root), states.stop(), program) +
                                    [(ours, "first resumed step seen by the bench")]), flush=True)  # fmt: skip
        return ours, (failsafe[0] if failsafe else None)
    finally:
        cluster.slurm("scancel", job, check=False)
        if victim:
            cluster.revive_node(victim)


def crash_plain(cluster: LocalCluster, work: Path) -> float:
    bjob, out = plain_submit(cluster, work, steps=400, step_time=0.3)
    victim = ""
    try:
        wait_for("plain training", lambda: out.exists() and len(STEP.findall(out.read_text(errors="replace"))) > 12, 300)
        batch, nodes = job_nodes(bjob)
        victim = next(n for n in nodes if n != batch)
        size = {out: out.stat().st_size}
        states = crash_timeline.SlurmStates(cluster.slurm, bjob, victim)
        t0 = time.time()
        cluster.crash_node(victim)
        seen = first_step_after(out.parent, out.name, size, 1, 300, marker="resumed from")
        base = seen - t0
        print(f"C  baseline (sbatch --requeue alone): node crash -> first resumed step {base:.1f} s", flush=True)
        program = crash_timeline.program_timings([out])
        print(crash_timeline.render("plain", crash_timeline.marks(t0, [], states.stop(), program) +
                                    [(base, "first resumed step seen by the bench")]), flush=True)  # fmt: skip
        return base
    finally:
        cluster.slurm("scancel", bjob, check=False)
        if victim:
            cluster.revive_node(victim)


def bench_node_crash(cluster: LocalCluster, work: Path) -> dict[str, float]:
    base = crash_plain(cluster, work / "crash-plain")
    nospare, _ = crash_supervised(cluster, work / "crash-nospare", "supervised, no spare")
    spare, _ = crash_supervised(cluster, work / "crash-spare", "supervised, 1 spare", "spare_nodes = 1\n")
    warm, _ = crash_supervised(cluster, work / "crash-warm", "supervised, 1 spare, warm restart", "spare_nodes = 1\n",
                               warm=True)  # fmt: skip
    host, failsafe = crash_supervised(cluster, work / "crash-batch", "supervised, 1 spare, batch host crashed",
                                      "spare_nodes = 1\n", batch_host=True)  # fmt: skip
    print("\n| node crash -> first resumed step | seconds | `sbatch --requeue` / this |\n|---|---|---|")
    print(f"| plain `sbatch --requeue` | {base:.1f} | 1.0x |")
    for label, value in (("supervisor, no spare (requeue at our verdict)", nospare),
                         ("supervisor, 1 spare (replaced in the allocation)", spare),
                         ("supervisor, 1 spare, warm restart (`--restartable`: a standby on the spare takes the lost "
                          "node's rank, the other rank keeps its process)", warm),
                         ("supervisor, 1 spare, batch host crashed (failsafe requeue)", host)):  # fmt: skip
        print(f"| {label} | {value:.1f} | {base / value:.1f}x |")
    if failsafe is not None:
        print(f"(batch host crash: the failsafe requeued the job {failsafe:.1f} s after the crash)")
    return {"plain": base, "no_spare": nospare, "spare": spare, "warm_spare": warm, "batch_host": host,
            "failsafe": failsafe or -1.0}


def last_printed(root: Path) -> int:
    steps = [int(m) for p in root.glob("logs/*/train-*.log") for m in STEP.findall(p.read_text(errors="replace"))]
    return max(steps, default=0)


def memory_row(cluster: LocalCluster, work: Path, fault: str, memory: str) -> tuple[int, float]:
    """(steps lost, seconds until training is past the pre-fault step again) for one fault with the memory tier
    ``memory`` ("auto" or "off"); DCP checkpoints every 50 steps, 0.1 s steps."""
    spare = "spare_nodes = 1\n" if fault == "crash" else ""
    job, root = supervise_submit(work, steps=600, step_time=0.1, ckpt_every=50,
                                 run_config=f'memory_snapshots = "{memory}"\n{spare}')  # fmt: skip
    victim = ""
    try:
        wait_for("training past step 70", lambda: last_printed(root) >= 70 or None, 300)
        sizes = {p: p.stat().st_size for p in root.glob("logs/*/train-*.log")}
        if fault == "kill":
            pid = int(wait_for("rank 1", lambda: live_rank(root, 1), 30)["pid"])
            t0, before = time.time(), last_printed(root)
            os.kill(pid, signal.SIGKILL)
        else:
            victim = training_victim(root, job)
            t0, before = time.time(), last_printed(root)
            cluster.crash_node(victim)
        relaunch = wait_for("the relaunch", lambda: events(root, "step_launched")[1:] or None, 120)[0]
        lost = before - int(relaunch.get("resume_step") or 0)
        past = first_step_after(root / "logs", "*/train-2.log", sizes, before + 1, 240) - t0
        print(f"M  {fault}, memory tier {memory}: resumed from {relaunch.get('resume_tier')} at step "
              f"{relaunch.get('resume_step')} ({lost} steps lost), past the pre-fault step {before} after {past:.1f} s",
              flush=True)  # fmt: skip
        return lost, past
    finally:
        cluster.slurm("scancel", job, check=False)
        if victim:
            cluster.revive_node(victim)


def bench_memory(cluster: LocalCluster, work: Path) -> None:
    """Issue 27: rank SIGKILL and node crash with a spare, memory tier on vs off, side by side."""
    rows = {(fault, memory): memory_row(cluster, work / f"mem-{fault}-{memory}", fault, memory)
            for fault in ("kill", "crash") for memory in ("auto", "off")}  # fmt: skip
    print("\n| fault (DCP every 50 steps of 0.1 s) | memory tier | steps lost | s until past the pre-fault step |")
    print("|---|---|---|---|")
    for (fault, memory), (lost, past) in rows.items():
        label = "rank SIGKILL" if fault == "kill" else "node crash, 1 spare"
        print(f"| {label} | {'on' if memory == 'auto' else 'off'} | {lost} | {past:.1f} |")


def state_load_s(root: Path) -> float | None:
    """The supervisor's recovery timings of the campaign's second launch (decisions/recovery_timings.py, as the
    report gives them), printed; the state load the ranks measured, or None."""
    timed = wait_for("the recovery's first step record",
                     lambda: next((r for r in recoveries(events(root))[1:] if r and r["up_s"] is not None), None), 30)
    print(f"   {recovery_text(timed)}", flush=True)
    return timed.get("restore_s")


def kill_and_time(root: Path, pid: int, label: str) -> tuple[int, float, float, float | None]:
    """SIGKILL ``pid`` (a rank), time the recovery and print it after ``label``: (steps lost, seconds until the first
    step after the fault, seconds until past the pre-fault step again, the state load within it)."""
    sizes = {p: p.stat().st_size for p in root.glob("logs/*/train-*.log")}
    t0, before = time.time(), last_printed(root)
    os.kill(pid, signal.SIGKILL)
    return time_the_restart(root, sizes, t0, before, label)


def time_the_restart(root: Path, sizes: dict[Path, int], t0: float, before: int,
                     label: str) -> tuple[int, float, float, float | None]:  # fmt: skip
    """After a fault at ``t0`` (wall time; ``before``: the last step printed before it; ``sizes``: the logs' sizes
    then): wait for the restart, time it and print it after ``label``: (steps lost, seconds until the first step
    after the fault, seconds until past the pre-fault step again, the state load within it)."""
    relaunch = wait_for("the restart", lambda: events(root, "step_launched")[1:] or None, 120)[0]
    resumed = int(relaunch.get("resume_step") or 0)
    first = first_step_after(root / "logs", "*/train-*.log", sizes, resumed + 1, 240) - t0
    past = first_step_after(root / "logs", "*/train-*.log", sizes, before + 1, 240) - t0
    how = "warm" if relaunch.get("generation") else "cold"
    how += " (a standby took the rank)" if relaunch.get("standby_ranks") else ""
    print(f"{label}: restarted {how} from {relaunch.get('resume_tier')} at step {resumed} ({before - resumed} steps "
          f"lost), first step after {first:.1f} s, past the pre-fault step {before} after {past:.1f} s", flush=True)
    return before - resumed, first, past, state_load_s(root)


def warm_row(cluster: LocalCluster, work: Path, mode: str,
             standbys: str = "off") -> tuple[int, float, float, float | None]:
    """Rank SIGKILL of the example run with ``--restartable`` (main() inside client.restartable), ``[run]
    warm_restart`` ``mode`` ("on" or "off") and ``standbys``, memory tier on, DCP every 50 steps of 0.1 s: (steps
    lost, seconds until the first step after the fault, seconds until training is past the pre-fault step again).
    With standbys the fault comes after the pool started and had STANDBY_READY_S to import torch (ahead of need)."""
    job, root = supervise_submit(work, steps=600, step_time=0.1, ckpt_every=50, extra=("--restartable",),
                                 run_config=f'warm_restart = "{mode}"\nstandbys = "{standbys}"\n')  # fmt: skip
    try:
        wait_for("training past step 70", lambda: last_printed(root) >= 70 or None, 300)
        if standbys != "off" and mode == "on":
            wait_for("the standbys", lambda: events(root, "standbys") or None, 60)
            time.sleep(STANDBY_READY_S)
        pid = int(wait_for("rank 1", lambda: live_rank(root, 1), 30)["pid"])
        return kill_and_time(root, pid, f"W  rank SIGKILL, warm_restart {mode}, standbys {standbys}")
    finally:
        cluster.slurm("scancel", job, check=False)


STANDBY_READY_S = 5.0
WARM_ROWS = {"warm restart, a standby takes the rank": ("on", "auto"),
             "warm restart, the rank started as a new step": ("on", "off"), "cold relaunch": ("off", "off")}


def bench_warm(cluster: LocalCluster, work: Path) -> None:
    """Issue 23: rank SIGKILL, warm restart with a standby taking the dead rank, warm restart starting it as a new
    step, and a cold relaunch (the step relaunched): the same program and settings, side by side."""
    rows = {label: warm_row(cluster, work / f"warm-{mode}-{standbys}", mode, standbys)
            for label, (mode, standbys) in WARM_ROWS.items()}  # fmt: skip
    print("\n| rank SIGKILL (2 ranks, 0.1 s steps, memory tier on) | steps lost | s until the first step after | "
          "s until past the pre-fault step | of which state load (s) |")  # fmt: skip
    print("|---|---|---|---|---|")
    for label, (lost, first, past, load) in rows.items():
        print(f"| {label} | {lost} | {first:.1f} | {past:.1f} | {'-' if load is None else f'{load:.2f}'} |")


def torchrun_warm_row(cluster: LocalCluster, work: Path, mode: str) -> tuple[int, float, float, float | None]:
    """Under ``srun torchrun`` (2 nodes x 2 workers, the example with ``--restartable``, ``[run] warm_restart``
    ``mode``): a worker of the node whose torchrun does not host the rendezvous store SIGKILLed. (steps lost,
    seconds until the first step after the fault, seconds until past the pre-fault step again)."""
    import psutil

    torchrun = (str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node=2")
    job, root = supervise_submit(work, steps=600, step_time=0.1, ckpt_every=50, extra=("--restartable",),
                                 run_config=f'warm_restart = "{mode}"\n', launcher=torchrun)  # fmt: skip
    try:
        wait_for("training past step 70", lambda: last_printed(root) >= 70 or None, 300)
        port = int(events(root, "step_launched")[0]["master"].rsplit(":", 1)[1])
        host = next(c.pid for c in psutil.net_connections(kind="tcp")
                    if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN)  # fmt: skip
        workers = {r: int(wait_for(f"rank {r}", lambda r=r: live_rank(root, r), 30)["pid"]) for r in range(4)}
        victim = next(pid for pid in workers.values() if psutil.Process(pid).ppid() != host)
        return kill_and_time(root, victim, f"T  torchrun worker SIGKILL, warm_restart {mode}")
    finally:
        cluster.slurm("scancel", job, check=False)


HANG_AT = 300  # (after the learned timeout: 20 samples, about one per rank per agent report, past warm-up)
HUNG = re.compile(r"rank 1 hangs after step (\d+) at ([0-9.]+)")


def hang_row(cluster: LocalCluster, work: Path, mode: str) -> tuple[float, int, float, float, float | None]:
    """A live hang of rank 1 (the example with ``--restartable --hang-at-step``: it sleeps, alive, outside any
    collective; its peer waits in the next all-reduce), ``[run] warm_restart`` ``mode``, standbys "auto", memory tier
    on: (seconds to the verdict, steps lost, seconds until the first step after the hang's start, until past the
    pre-fault step, the state load within it), all from the hang's start as the rank printed it."""
    job, root = supervise_submit(work, steps=600, step_time=0.1, ckpt_every=50,
                                 extra=("--restartable", "--hang-at-step", str(HANG_AT)),
                                 run_config=f'warm_restart = "{mode}"\n')  # fmt: skip
    try:
        def hung() -> tuple[int, float] | None:
            for path in root.glob("logs/*/train-*.log"):
                m = HUNG.search(path.read_text(errors="replace"))
                if m:
                    return int(m.group(1)), float(m.group(2))
            return None

        step, t0 = wait_for("rank 1's hang", hung, 300)
        sizes = {p: p.stat().st_size for p in root.glob("logs/*/train-*.log")}
        lost, first, past, load = time_the_restart(root, sizes, t0, step, f"H  live hang of rank 1, warm_restart {mode}")
        verdict = next(e["t"] for e in events(root, "interruption")) - t0
        print(f"   verdict {verdict:.1f} s after the hang's start", flush=True)
        return verdict, lost, first, past, load
    finally:
        cluster.slurm("scancel", job, check=False)


def bench_warm_hang(cluster: LocalCluster, work: Path) -> None:
    """Issue 23: a live hang (a rank alive, outside any collective, its peer blocked in the all-reduce), warm
    restart (the hung rank's stack saved, it alone killed, a standby takes it; the peer keeps its process) vs a cold
    relaunch, the same program and settings, side by side."""
    rows = {label: hang_row(cluster, work / f"hang-{mode}", mode)
            for label, mode in (("warm restart", "on"), ("cold relaunch", "off"))}  # fmt: skip
    print(f"\n| live hang of rank 1 after step {HANG_AT} (2 ranks, 0.1 s steps, memory tier on) | s to the verdict | "
          "steps lost | s until the first step after | s until past the pre-fault step | of which state load (s) |"
          "\n|---|---|---|---|---|---|")  # fmt: skip
    for label, (verdict, lost, first, past, load) in rows.items():
        print(f"| {label} | {verdict:.1f} | {lost} | {first:.1f} | {past:.1f} | {'-' if load is None else f'{load:.2f}'} |")


def bench_warm_torchrun(cluster: LocalCluster, work: Path) -> None:
    """Issue 23 under torchrun: a worker SIGKILLed, warm restart (the node's workers started again without
    torchrun, the other node's kept) vs a cold relaunch, the same program and settings, side by side."""
    rows = {label: torchrun_warm_row(cluster, work / f"torchrun-{mode}", mode)
            for label, mode in (("warm restart", "on"), ("cold relaunch", "off"))}  # fmt: skip
    print("\n| torchrun worker SIGKILL (2 nodes x 2 workers, 0.1 s steps, memory tier on) | steps lost | "
          "s until the first step after | s until past the pre-fault step | of which state load (s) |\n"
          "|---|---|---|---|---|")  # fmt: skip
    for label, (lost, first, past, load) in rows.items():
        print(f"| {label} | {lost} | {first:.1f} | {past:.1f} | {'-' if load is None else f'{load:.2f}'} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline-window", type=float, default=120.0)
    parser.add_argument("--only", choices=("hang", "kill", "crash", "memory", "warm", "warm-crash", "warm-hang",
                                           "warm-torchrun"))
    parser.add_argument("--accounting", action="store_true",
                        help="the cluster with slurmdbd, as sites run it (the no-spare requeue then drops the lost "
                             "node from the allocation first; docs/node-loss.md)")  # fmt: skip
    args = parser.parse_args()
    cluster = LocalCluster(base_port=int(os.environ.get("SUPERVISOR_CLUSTER_BASE_PORT", DEFAULT_BASE_PORT)),
                           accounting=args.accounting)  # fmt: skip
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
        if args.only in (None, "memory"):
            bench_memory(cluster, work)
        if args.only in (None, "warm"):
            bench_warm(cluster, work)
        if args.only == "warm-hang":
            bench_warm_hang(cluster, work)
        if args.only == "warm-torchrun":
            bench_warm_torchrun(cluster, work)
        if args.only == "warm-crash":  # (part of "crash"): the spare relaunch cold vs warm, side by side
            cold, _ = crash_supervised(cluster, work / "crash-spare", "supervised, 1 spare", "spare_nodes = 1\n")
            warm, _ = crash_supervised(cluster, work / "crash-warm", "supervised, 1 spare, warm restart",
                                       "spare_nodes = 1\n", warm=True)  # fmt: skip
            print(f"\n| node crash, 1 spare -> first resumed step | seconds |\n|---|---|\n| cold relaunch | {cold:.1f} |"
                  f"\n| warm restart | {warm:.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

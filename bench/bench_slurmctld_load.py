"""The supervisor's load on slurmctld, measured with ``sdiag`` on the real local Slurm (issue 25).

    python bench/bench_slurmctld_load.py [--campaigns 16] [--window 120] [--oversubscribe K] [--site]

N idle supervised campaigns (one node, one task each; the program sleeps, so only the supervision is measured)
run at once, twice, side by side in one run:
  A. in the ``batch`` partition: preemptible with GraceTime=10 (the background query runs every 3 s: a lost
     preemption signal must still leave most of the grace time; the same period every campaign had before);
  B. in the ``urgent`` partition: PreemptMode=OFF (nothing to catch early: one query per 5 minutes).
Once every campaign's training is launched, ``sdiag --reset``, then the RPCs slurmctld received during
``--window`` seconds, by message type, less a window of the idle cluster measured first (node pings and
registrations), per campaign per minute; and the supervisors' CPU share over the same window (psutil).
Goal: steady state <= 2 RPC/min per campaign where the job cannot be preempted or its grace time is long.
Then the RPCs one campaign costs for one fault (its program SIGKILLed: relaunched in the allocation) and for one
requeue (``scontrol requeue``: a new Slurm run of the batch script), counted from the event until the relaunched
program has run 10 s, Slurm's own messages for the requeue included.

The local cluster has 16 CPUs (4 nodes x 4): at most 16 one-task jobs run at once, so N defaults to 16 here.
``--oversubscribe K`` runs more (``--campaigns 50 --oversubscribe 4``): two partitions made for the bench at run
time (``scontrol create``, deleted after), ``bench-batch`` (as ``batch``) and ``bench-urgent`` (preempted without
grace: the same 5-minute query as ``urgent``'s PreemptMode=OFF, which does not oversubscribe), with
``OverSubscribe=FORCE:K`` (K jobs per CPU), so 16 x K idle jobs fit.
``--site``: every campaign names a site service (started here) in ``[site]``: their job polls go to it, and it
reads all their jobs with one query a round (supervisor/site/job_watch.py); its RPCs are in the figures.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from examples.campaign_view import events  # noqa: E402

PROGRAM = "import time\nwhile True:\n    time.sleep(1)\n"
_RPC = re.compile(r"^\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)", re.M)


def sdiag() -> dict[str, int]:
    """RPC counts by message type since the last reset (the first section of sdiag's RPC statistics)."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True).stdout
    section = out.split("Remote Procedure Call statistics by message type", 1)[-1]
    section = section.split("Remote Procedure Call statistics by user", 1)[0]
    # REQUEST_STATS_INFO: sdiag itself (the measurement, not the supervisors)
    return {name: int(count) for name, count in _RPC.findall(section) if name != "REQUEST_STATS_INFO"}


def reset() -> None:
    subprocess.run(["sdiag", "--reset"], capture_output=True, check=True)


SITE: dict[str, str] = {}  # url, token_file when --site


def start_site(work: Path) -> subprocess.Popen[str]:
    """``supervise site serve`` on a free loopback port and a token for the campaigns (SITE)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "site", "serve", "--dir", str(work / "site"),
                               "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True, cwd=REPO)  # fmt: skip
    assert server.stdout is not None and "site service on" in server.stdout.readline()
    token = work / "bench.site-token"
    subprocess.run([sys.executable, "-m", "supervisor.cli", "site", "token", "--dir", str(work / "site"), "--user",
                    "bench", "--out", str(token)], check=True, capture_output=True, cwd=REPO)  # fmt: skip
    SITE.update(url=f"http://127.0.0.1:{port}", token_file=str(token))
    return server


def submit(work: Path, partition: str) -> tuple[str, Path]:
    work.mkdir(parents=True, exist_ok=True)
    (work / "idle.py").write_text(PROGRAM)
    site = f'[site]\nurl = "{SITE["url"]}"\ntoken_file = "{SITE["token_file"]}"\n' if SITE else ""
    (work / "c.toml").write_text("[preflight]\nenabled = false\n" + site)
    root = work / "campaign"
    out = subprocess.run(
        [sys.executable, "-m", "supervisor.cli", "submit", "-N", "1", "--ntasks-per-node=1", "--time=30",
         f"--partition={partition}", "--campaign", str(root), "--config", str(work / "c.toml"), "--",
         sys.executable, str(work / "idle.py")],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout  # fmt: skip
    return out.split()[1], root


def supervisors_cpu_s(roots: list[Path]) -> float:
    """CPU seconds used so far by the supervisor processes of these campaigns (user + system)."""
    import psutil

    wanted = {str(r) for r in roots}
    total = 0.0
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "supervisor.cli" in cmd and "run" in cmd and wanted & set(cmd):
            try:
                t = proc.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                continue
    return total


def bench_partitions(k: int) -> dict[str, str]:
    """Partitions like ``batch`` and ``urgent`` but K jobs per CPU; {the cluster's name: the bench's}."""
    made = {"batch": "bench-batch", "urgent": "bench-urgent"}
    # (a partition with PreemptMode=OFF does not oversubscribe here (22.05): the bench's "urgent" is preempted
    # without grace instead, which the poller treats the same way: one query per 5 minutes)
    settings = {"batch": ["PriorityTier=1", "PreemptMode=REQUEUE", "GraceTime=10"],
                "urgent": ["PriorityTier=1", "PreemptMode=REQUEUE", "GraceTime=0"]}  # fmt: skip
    for name, bench in made.items():
        subprocess.run(["scontrol", "delete", f"PartitionName={bench}"], capture_output=True, check=False)
        subprocess.run(["scontrol", "create", f"PartitionName={bench}", "Nodes=ALL", "MaxTime=INFINITE", "State=UP",
                        f"OverSubscribe=FORCE:{k}", *settings[name]], capture_output=True, check=True)  # fmt: skip
    return made


def measure(partition: str, n: int, window: float, idle: dict[str, int], work: Path) -> dict[str, float]:
    jobs = [submit(work / f"{partition}-{i}", partition) for i in range(n)]
    roots = [root for _, root in jobs]
    try:
        deadline = time.monotonic() + 300 + 10 * n
        while time.monotonic() < deadline:
            if all(events(r, "step_launched") for r in roots):
                break
            time.sleep(2)
        else:
            raise SystemExit(f"{partition}: not every campaign launched within {300 + 10 * n} s")
        time.sleep(10)  # the start-up queries are over
        cpu0 = supervisors_cpu_s(roots)
        reset()
        time.sleep(window)
        counts = sdiag()
        cpu = supervisors_cpu_s(roots) - cpu0
    finally:
        subprocess.run(["scancel", *[j for j, _ in jobs]], capture_output=True, check=False)
    minutes = window / 60
    extra = {k: v - idle.get(k, 0) for k, v in counts.items() if v - idle.get(k, 0) > 0}
    per = sum(extra.values()) / n / minutes
    print(f"\n{partition}: {n} campaigns, {window:.0f} s: {per:.2f} RPC/min per campaign; "
          f"supervisors' CPU {100 * cpu / window / n:.2f} % of a core each")  # fmt: skip
    for name, count in sorted(extra.items(), key=lambda kv: -kv[1]):
        print(f"    {name:<36} {count / n / minutes:6.2f} /min per campaign")
    return {"rpc_per_min": per, "cpu_share": cpu / window / n}


def wait_launches(root: Path, n: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while len(events(root, "step_launched")) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"{root}: launch {n} not seen within {timeout:.0f} s")
        time.sleep(0.5)


def kill_program(work: Path) -> None:
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        if (proc.info["cmdline"] or [])[1:] == [str(work / "idle.py")]:  # the program itself (not srun, the supervisor)
            proc.kill()


def per_event(work: Path, idle: dict[str, int], window: float) -> None:
    """RPCs for one fault and for one requeue of one campaign (not preemptible: no background query inside)."""
    job, root = submit(work / "events", "urgent")
    try:
        wait_launches(root, 1)
        time.sleep(10)
        for what, act in (("a fault (program SIGKILLed, relaunched in the allocation)", lambda: kill_program(work / "events")),
                          ("a requeue (scontrol requeue, new batch run)",
                           lambda: subprocess.run(["scontrol", "requeue", job], check=True, capture_output=True))):  # fmt: skip
            seen = len(events(root, "step_launched"))
            reset()
            started = time.monotonic()
            act()
            wait_launches(root, seen + 1)
            time.sleep(10)
            counts = sdiag()
            took = time.monotonic() - started
            extra = {k: v - round(idle.get(k, 0) * took / window) for k, v in counts.items()}
            extra = {k: v for k, v in extra.items() if v > 0}
            print(f"\n{what}: {sum(extra.values())} RPCs in {took:.0f} s")
            for name, count in sorted(extra.items(), key=lambda kv: -kv[1]):
                print(f"    {name:<36} {count:4d}")
    finally:
        subprocess.run(["scancel", job], capture_output=True, check=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--campaigns", type=int, default=16)
    p.add_argument("--window", type=float, default=120.0)
    p.add_argument("--oversubscribe", type=int, default=0, metavar="K",
                   help="run in bench partitions with K jobs per CPU (for more than 16 campaigns)")
    p.add_argument("--site", action="store_true", help="the campaigns poll their jobs through a site service")
    args = p.parse_args()
    parts = bench_partitions(args.oversubscribe) if args.oversubscribe > 1 else {"batch": "batch", "urgent": "urgent"}
    with tempfile.TemporaryDirectory(prefix="bench-ctld-") as tmp:
        server = start_site(Path(tmp)) if args.site else None
        try:
            reset()
            time.sleep(args.window)
            idle = sdiag()
            print(f"idle cluster: {sum(idle.values())} RPCs in {args.window:.0f} s (subtracted below)")
            a = measure(parts["batch"], args.campaigns, args.window, idle, Path(tmp))
            time.sleep(15 + args.campaigns / 4)  # the cancelled jobs leave
            b = measure(parts["urgent"], args.campaigns, args.window, idle, Path(tmp))
            time.sleep(15 + args.campaigns / 4)
            per_event(Path(tmp), idle, args.window)
        finally:
            if server is not None:
                server.kill()
            for name, bench in parts.items():
                if bench != name:
                    subprocess.run(["scontrol", "delete", f"PartitionName={bench}"], capture_output=True, check=False)
    print(f"\nsteady state per campaign: preemptible (GraceTime=10) {a['rpc_per_min']:.2f} RPC/min, "
          f"not preemptible {b['rpc_per_min']:.2f} RPC/min (one query per 5 min: a window under 300 s may see none)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Detection freshness: how soon the supervisor knows what a rank did, with a real agent and real ranks.

Measured (real processes on this host, real UDP, the shipped agent at the given intervals):
  beat -> known:   for every beat, (time the aggregator accepted the first summary showing it or a later
                   step) - (the beat's time); same host, so both are CLOCK_MONOTONIC.  Bounded by the
                   report interval + one sample interval + transit.
  SIGSTOP -> seen: from os.kill(rank, SIGSTOP) to the aggregator's table showing the rank ``stopped``.
  SIGKILL -> seen: from os.kill(rank, SIGKILL) to the table showing it dead (``zombie`` until reaped, ``gone``).
Documented constants, not measured here (the defaults a job without this path relies on):
  Slurm SlurmdTimeout default 300 s (slurm.conf(5)) before a dead node is marked DOWN;
  torch ProcessGroupNCCL default timeout (read from the installed torch if importable; 10 min) before a
  collective stuck on a dead/hung peer raises.
A hang detector with silence threshold T fires at T + (beat -> known); these figures are that added delay.

    .venv/bin/python bench/bench_detection_freshness.py [--seconds 8] [--trials 10]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.heartbeat import wire  # noqa: E402
from supervisor.heartbeat.server import AggregatorServer  # noqa: E402

SLURMD_TIMEOUT_DEFAULT_S = 300.0  # slurm.conf(5): "The default value is 300 seconds."
JOB = "777"
RANK = """
import sys, time
from supervisor import client
i = 0
while True:
    client.step(i)
    i += 1
    time.sleep(0.05)
"""


def nccl_default_timeout_s() -> tuple[float, str]:
    try:
        from torch.distributed.constants import default_pg_nccl_timeout  # type: ignore[attr-defined]
    except Exception:  # noqa: BLE001 - torch absent or older: use the documented value
        return 600.0, "documented torch default (10 min); torch not importable"
    if default_pg_nccl_timeout is None:  # CPU-only builds have no NCCL
        return 600.0, "documented torch default (10 min); this torch build has no NCCL"
    return default_pg_nccl_timeout.total_seconds(), "read from the installed torch"


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class Rig:
    def __init__(self, tmp: Path, sample_s: float, report_s: float) -> None:
        self.server = AggregatorServer(tmp / "campaign", JOB, rate_window_s=1.0, keepalive_interval_s=1.0,
                                       live_interval_s=3600)
        self.server.write_address_file()  # the agent reads this run's channel value there
        self.slots = tmp / "slots"
        self.slots.mkdir(mode=0o700)
        self.script = tmp / "rank.py"
        self.script.write_text(RANK)
        host, port = self.server.address
        self.agent = subprocess.Popen([sys.executable, "-m", "supervisor.agent", "--campaign", str(tmp / "campaign"),
                                       "--supervisor", f"{host}:{port}", "--job-id", JOB, "--node", "n1",
                                       "--slot-dir", str(self.slots), "--sample-interval", str(sample_s),
                                       "--report-interval", str(report_s), "--supervisor-timeout", "30"],
                                      stderr=subprocess.DEVNULL)
        self.ranks: dict[int, subprocess.Popen[bytes]] = {}
        self.beat_lat: list[float] = []
        self._seen_seq = 0
        self._last: dict[int, tuple[int, int, int]] = {}  # rank -> (pid, step, beat time ns) last reported

    def start_rank(self, rank: int) -> None:
        env = {**os.environ, "SUPERVISOR_SLOT_DIR": str(self.slots), "RANK": str(rank), "LOCAL_RANK": str(rank),
               "WORLD_SIZE": "2"}
        self.ranks[rank] = subprocess.Popen([sys.executable, str(self.script)], env=env)

    def pump(self) -> None:
        """Poll once; for a newly accepted summary, record when each beat since the previous summary became
        known.  Beat times between two reported beats are interpolated by step number (the ranks beat at a
        steady 20 Hz), so every beat counts, not only the ones that happened to be sampled."""
        self.server.poll(0.002)
        st = self.server.table.nodes.get("n1")
        if st is None or st.seq == self._seen_seq:
            return
        self._seen_seq = st.seq
        known = time.monotonic_ns()
        for e in wire.iter_ranks(st.body):
            if e.state not in (wire.ST_RUNNING, wire.ST_SLEEPING) or e.beat_age_ms == wire.NO_BEAT or e.beats < 2:
                continue
            t_beat = st.sent_mono_ns - e.beat_age_ms * 1_000_000
            prev = self._last.get(e.rank)
            self._last[e.rank] = (e.pid, e.step, t_beat)
            if prev is None or prev[0] != e.pid or e.step <= prev[1]:
                continue
            _, s0, t0 = prev
            for s in range(s0 + 1, e.step + 1):
                t = t0 + (t_beat - t0) * (s - s0) / (e.step - s0)
                self.beat_lat.append((known - t) / 1e9)

    def state(self, rank: int) -> tuple[str, int]:
        for r in self.server.table.rank_views():
            if r.rank == rank:
                return r.state, r.pid
        return "", 0

    def until(self, pred: Callable[[], bool], timeout: float = 15.0) -> float:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            self.pump()
            if pred():
                return time.monotonic() - t0
        raise TimeoutError("condition not reached")

    def idle(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.pump()

    def close(self) -> None:
        for p in [*self.ranks.values(), self.agent]:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            p.wait()
        self.server.close()


def run_config(sample_s: float, report_s: float, seconds: float, trials: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        rig = Rig(Path(tmp), sample_s, report_s)
        try:
            rig.start_rank(0)
            rig.start_rank(1)
            rig.until(lambda: rig.state(0)[0] in ("running", "sleeping") and rig.state(1)[0] in ("running", "sleeping"),
                      30)
            rig.beat_lat.clear()
            rig._last.clear()
            agent = psutil.Process(rig.agent.pid)
            cpu0, t_start = sum(agent.cpu_times()[:2]), time.monotonic()
            end = t_start + seconds
            while time.monotonic() < end:
                rig.pump()
            agent_cpu = (sum(agent.cpu_times()[:2]) - cpu0) / (time.monotonic() - t_start)
            beat = list(rig.beat_lat)
            stop, kill = [], []
            rng = random.Random(1)
            for _ in range(trials):
                rig.idle(rng.uniform(0, 0.5))  # faults strike at a random phase of the agent's sampling
                pid = rig.ranks[1].pid
                t0 = time.monotonic()
                os.kill(pid, signal.SIGSTOP)
                rig.until(lambda: rig.state(1)[0] == "stopped")
                stop.append(time.monotonic() - t0)
                os.kill(pid, signal.SIGCONT)
                rig.until(lambda: rig.state(1)[0] in ("running", "sleeping"))
            for _ in range(max(1, trials // 2)):
                rig.idle(rng.uniform(0, 0.5))
                proc = rig.ranks[1]
                t0 = time.monotonic()
                proc.kill()
                # Our child stays a zombie until we reap it (slurmstepd reaps at once): dead either way.
                rig.until(lambda: rig.state(1)[0] in ("gone", "zombie"))
                kill.append(time.monotonic() - t0)
                proc.wait()
                rig.start_rank(1)
                new_pid = rig.ranks[1].pid
                rig.until(lambda pid=new_pid: rig.state(1) in (("running", pid), ("sleeping", pid)), 30)
            return {"beat": beat, "stop": stop, "kill": kill, "agent_cpu": [agent_cpu]}
        finally:
            rig.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=8.0, help="seconds of beat-latency sampling per config")
    p.add_argument("--trials", type=int, default=10, help="SIGSTOP trials per config (half as many SIGKILLs)")
    args = p.parse_args()
    nccl_s, nccl_src = nccl_default_timeout_s()
    print("# detection freshness: 2 real ranks (client.step at 20 Hz), real agent, aggregator over loopback UDP")
    print(f"# baselines (documented constants, not measured): Slurm SlurmdTimeout {SLURMD_TIMEOUT_DEFAULT_S:.0f} s; "
          f"NCCL process-group timeout {nccl_s:.0f} s ({nccl_src})")
    print(f"{'config':<26} {'what':<16} {'n':>4} {'p50 s':>7} {'p99 s':>7} {'max s':>7} "
          f"{'vs Slurmd':>10} {'vs NCCL':>9}")
    for sample_s, report_s in ((0.25, 1.0), (0.1, 0.5)):
        r = run_config(sample_s, report_s, args.seconds, args.trials)
        name = f"sample {sample_s}s report {report_s}s"
        for what, key in (("beat -> known", "beat"), ("SIGSTOP -> seen", "stop"), ("SIGKILL -> seen", "kill")):
            v = r[key]
            p99 = pct(v, 0.99)
            print(f"{name:<26} {what:<16} {len(v):>4} {statistics.median(v):>7.3f} {p99:>7.3f} {max(v):>7.3f} "
                  f"{SLURMD_TIMEOUT_DEFAULT_S / p99:>9.0f}x {nccl_s / p99:>8.0f}x", flush=True)
        print(f"{name:<26} agent CPU while sampling 2 ranks: {100 * r['agent_cpu'][0]:.1f}% of a core", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

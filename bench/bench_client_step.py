#!/usr/bin/env python3
"""Cost of one ``client.step()`` heartbeat, side by side with the alternatives, in the same run.

WHY: the heartbeat sits inside every training iteration, so it must cost next to nothing. This
script times, call by call (gc off), in a tight loop and "spaced" (some CPU work between calls, as
in a real loop, where cross-CPU wake-ups make socket-based methods dearer):

  ours     supervisor client.step(i) / step(i, loss) / should_checkpoint() on a real slot
  (a)      NVIDIA resiliency-ext 0.7.0 RankMonitorClient.send_heartbeat() and
           start_section("step")+end_section("step"), under its ft_launcher (installed into
           bench/out/, never into .venv; see /work/shared/notes/baselines.md)
  (b)      torch.distributed.elastic FileTimerClient: `with expires(after=60, scope="step")`,
           with a FileTimerServer in another process
  (c)      UDP sendto of 32 bytes to a loopback receiver process
  (d)      time.monotonic_ns() alone (the timer floor: every figure includes one clock read)

Usage: python bench/bench_client_step.py [--quick] [--no-nvrx] [--no-install] [--json FILE]
Prints a table with median and p99 ns per call and each method's ratio to client.step().
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "out"
NVRX_DIR = OUT / "nvrx"
NVRX_DEPS = OUT / "nvrx-deps"
NVRX_VERSION = "0.7.0"
# 0.7.0's declared dependencies, less the ones .venv already has (torch, numpy, psutil, nvidia-ml-py).
NVRX_DEP_SPECS = [
    "defusedxml", "fastapi>=0.100.0", "grpcio>=1.76.0,<2", "grpcio-tools>=1.76.0,<2", "httpx>=0.24.0",
    "packaging", "protobuf>=4.22.0", "pydantic>=2", "pydantic-settings>=2", "pyyaml", "slowapi>=0.1.9",
    "uvicorn[standard]>=0.20.0",
]  # fmt: skip
SPACING_NS = 20_000  # CPU work between calls in the "spaced" variant

LOOP_TEMPLATE = """
def loop(_n, _spaced):
    _out = [0] * _n
    _clock = _mono
    for i in range(_n):
        if _spaced:
            _until = _clock() + {spacing}
            while _clock() < _until:
                pass
        _t0 = _clock()
        {call}
        _t1 = _clock()
        _out[i] = _t1 - _t0
    return _out
"""


def make_loop(call: str, namespace: dict[str, object]) -> Callable[[int, bool], list[int]]:
    """A timing loop with ``call`` inlined, so no method pays for an extra wrapper call."""
    ns = dict(namespace, _mono=time.monotonic_ns)
    exec(LOOP_TEMPLATE.format(call=call, spacing=SPACING_NS), ns)  # noqa: S102 - fixed local template
    return ns["loop"]  # type: ignore[return-value]


def measure(loop: Callable[[int, bool], list[int]], n: int, runs: int, spaced: bool) -> dict[str, float]:
    """Median and p99 per call: the median over ``runs`` runs of each run's median / p99."""
    loop(max(n // 10, 10), spaced)  # warm-up (specialisation, caches, first IPC connections)
    medians, p99s = [], []
    for _ in range(runs):
        gc.disable()
        try:
            samples = loop(n, spaced)
        finally:
            gc.enable()
        samples.sort()
        medians.append(samples[len(samples) // 2])
        p99s.append(samples[min(len(samples) - 1, int(len(samples) * 0.99))])
    return {"median": statistics.median(medians), "p99": statistics.median(p99s), "n": n, "runs": runs}


# --- the methods ------------------------------------------------------------------------------


def bench_ours(n: int, runs: int, spaced: bool) -> dict[str, dict[str, float]]:
    from supervisor import client
    from supervisor.client import api

    assert api._writer is not None, "the slot was not set up"
    results = {}
    results["supervisor client.step(i)"] = measure(make_loop("step(i)", {"step": client.step}), n, runs, spaced)
    results["supervisor client.step(i, loss=x)"] = measure(
        make_loop("step(i, 0.5)", {"step": client.step}), n, runs, spaced
    )
    results["supervisor client.should_checkpoint()"] = measure(
        make_loop("should()", {"should": client.should_checkpoint}), n, runs, spaced
    )
    return results


def bench_monotonic(n: int, runs: int, spaced: bool, workdir: Path) -> dict[str, dict[str, float]]:
    return {"time.monotonic_ns() alone": measure(make_loop("mono()", {"mono": time.monotonic_ns}), n, runs, spaced)}


def bench_udp(n: int, runs: int, spaced: bool, workdir: Path) -> dict[str, dict[str, float]]:
    receiver = subprocess.Popen(
        [sys.executable, "-c",
         "import socket, sys\n"
         "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
         "s.bind(('127.0.0.1', 0))\n"
         "print(s.getsockname()[1], flush=True)\n"
         "while True:\n"
         "    s.recv(2048)\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert receiver.stdout is not None
        port = int(receiver.stdout.readline())
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        payload = b"x" * 32
        loop = make_loop("sendto(payload, addr)", {"sendto": sock.sendto, "payload": payload, "addr": ("127.0.0.1", port)})
        result = measure(loop, n, runs, spaced)
        sock.close()
        return {"UDP sendto 32 B to loopback": result}
    finally:
        receiver.kill()
        receiver.wait()


FILETIMER_SERVER = """
import sys
from torch.distributed.elastic.timer.file_based_local_timer import FileTimerServer
server = FileTimerServer(sys.argv[1], run_id="bench", max_interval=0.1, daemon=True)
server.start()
print("ready", flush=True)
sys.stdin.read()
server.stop()
"""


def bench_filetimer(n: int, runs: int, spaced: bool, workdir: Path) -> dict[str, dict[str, float]]:
    from torch.distributed.elastic.timer import expires
    from torch.distributed.elastic.timer.file_based_local_timer import FileTimerClient

    fifo = workdir / "filetimer.fifo"
    server = subprocess.Popen(
        [sys.executable, "-c", FILETIMER_SERVER, str(fifo)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        timer_client = FileTimerClient(str(fifo))
        body = "with expires(after=60, scope='step', client=timer_client):\n            pass"
        batch_loop = make_loop(body, {"expires": expires, "timer_client": timer_client})
        batch = 100  # the 64 KiB FIFO holds ~150 blocks while the server sleeps 0.1 s between reads

        def loop(count: int, spaced_: bool) -> list[int]:
            samples: list[int] = []
            while len(samples) < count:
                samples += batch_loop(min(batch, count - len(samples)), spaced_)
                time.sleep(0.25)  # untimed: let the server drain the FIFO
            return samples

        return {"torch FileTimer expires(after=60, scope='step') block": measure(loop, n, runs, spaced)}
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# --- NVIDIA resiliency-ext: installed apart, measured in a worker under its own launcher ---------


def ensure_nvrx(install: bool) -> str | None:
    """None when NVRx can be imported from bench/out, else the reason it cannot."""
    probe = [sys.executable, "-c", "import nvidia_resiliency_ext.fault_tolerance as ft; ft.RankMonitorClient"]
    env = dict(os.environ, PYTHONPATH=nvrx_pythonpath())
    if subprocess.run(probe, env=env, capture_output=True).returncode == 0:
        return None
    if not install:
        return f"not installed in {NVRX_DIR} and --no-install given"
    dl = OUT / "nvrx-dl"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    platform = ["--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_39_x86_64"]
    steps = [
        pip + ["download", "--no-deps", *platform, f"nvidia-resiliency-ext=={NVRX_VERSION}", "-d", str(dl)],
        pip + ["install", "--no-deps", *platform, "--target", str(NVRX_DIR), "--upgrade",
               f"nvidia-resiliency-ext=={NVRX_VERSION}", "--find-links", str(dl), "--no-index"],
        pip + ["install", "--target", str(NVRX_DEPS), "--upgrade", *NVRX_DEP_SPECS],
    ]  # fmt: skip
    for cmd in steps:
        print("installing NVRx baseline:", " ".join(cmd[3:6]), "...", file=sys.stderr)
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["(no output)"]
            return f"`{' '.join(cmd[2:])}` failed: {tail[0]}"
    if subprocess.run(probe, env=env, capture_output=True).returncode != 0:
        return "installed, but `import nvidia_resiliency_ext.fault_tolerance` still fails"
    return None


def nvrx_pythonpath() -> str:
    return os.pathsep.join([str(NVRX_DIR), str(NVRX_DEPS), str(REPO)])


def bench_nvrx(n: int, runs: int, spaced: bool, workdir: Path) -> dict[str, dict[str, float]]:
    out = workdir / f"nvrx-{'spaced' if spaced else 'tight'}.json"
    cmd = [
        sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher", "--nproc-per-node=1",
        "--max-restarts=0", "--standalone", "--ft-initial-rank-heartbeat-timeout=600",
        "--ft-rank-heartbeat-timeout=300", "--ft-rank-section-timeouts=step:300",
        "--ft-rank-out-of-section-timeout=600", str(Path(__file__).resolve()),
        "--nvrx-worker", str(out), "--n", str(n), "--runs", str(runs),
    ] + (["--spaced"] if spaced else [])  # fmt: skip
    env = dict(os.environ, PYTHONPATH=nvrx_pythonpath())
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if not out.exists():
        lines = (done.stdout + done.stderr).strip().splitlines()
        errors = [line for line in lines if "Error" in line and not line.startswith("20")]
        tail = (errors or lines or ["(no output)"])[-1]
        raise RuntimeError(f"ft_launcher run failed (exit {done.returncode}): {tail}")
    return json.loads(out.read_text())


def nvrx_worker(out: Path, n: int, runs: int, spaced: bool) -> None:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    nv = RankMonitorClient()
    nv.init_workload_monitoring()
    results = {
        "NVRx send_heartbeat()": measure(make_loop("hb()", {"hb": nv.send_heartbeat}), n, runs, spaced),
        "NVRx start_section+end_section('step')": measure(
            make_loop("start('step')\n        end('step')", {"start": nv.start_section, "end": nv.end_section}),
            n, runs, spaced,
        ),
    }  # fmt: skip
    nv.shutdown_workload_monitoring()
    out.write_text(json.dumps(results))


# --- driver -----------------------------------------------------------------------------------


def print_table(title: str, rows: dict[str, dict[str, float] | str], ours: str) -> None:
    base = rows.get(ours)
    print(f"\n{title}")
    print(f"{'method':<56} {'median ns':>10} {'p99 ns':>10} {'x client.step':>14}")
    for name, r in rows.items():
        if isinstance(r, str):
            print(f"{name:<56} unavailable: {r}")
            continue
        ratio = f"{r['median'] / base['median']:.1f}x" if isinstance(base, dict) and base["median"] else "-"
        print(f"{name:<56} {r['median']:>10,.0f} {r['p99']:>10,.0f} {ratio:>14}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and one run per method")
    parser.add_argument("--no-nvrx", action="store_true", help="skip the NVIDIA resiliency-ext baseline")
    parser.add_argument("--no-install", action="store_true", help="do not pip-install NVRx into bench/out")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--nvrx-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--spaced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nvrx_worker:
        nvrx_worker(args.nvrx_worker, args.n, args.runs, args.spaced)
        return 0

    runs = 1 if args.quick else 3
    n_cheap, n_ipc, n_timer = (20_000, 3_000, 500) if args.quick else (200_000, 20_000, 3_000)
    OUT.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-client-", dir=OUT))
    slot_dir = Path(tempfile.mkdtemp(prefix="bench-client-slot-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    os.environ["SUPERVISOR_SLOT_DIR"] = str(slot_dir)
    nvrx_problem = "skipped (--no-nvrx)" if args.no_nvrx else ensure_nvrx(not args.no_install)
    all_results: dict[str, dict[str, dict[str, float] | str]] = {}
    ours = "supervisor client.step(i)"
    try:
        from supervisor import client

        client.step(0)  # set up the slot before timing
        for spaced in (False, True):
            scale = 5 if spaced else 1  # spaced calls cost ~20 us each: fewer of them
            rows: dict[str, dict[str, float] | str] = {}
            rows.update(bench_ours(n_cheap // scale, runs, spaced))
            baselines: list[tuple[str, Callable[..., dict[str, dict[str, float]]], int]] = [
                ("NVRx send_heartbeat()", bench_nvrx, n_ipc),
                ("torch FileTimer expires(after=60, scope='step') block", bench_filetimer, n_timer),
                ("UDP sendto 32 B to loopback", bench_udp, n_ipc),
                ("time.monotonic_ns() alone", bench_monotonic, n_cheap),
            ]
            for name, fn, n in baselines:
                if fn is bench_nvrx and nvrx_problem:
                    rows[name] = nvrx_problem
                    continue
                try:
                    rows.update(fn(n // scale, runs, spaced, workdir))
                except Exception as exc:  # one broken baseline must not hide the others
                    rows[name] = f"{type(exc).__name__}: {exc}"
            key = "spaced" if spaced else "tight"
            all_results[key] = rows
            title = (f"spaced loop ({SPACING_NS // 1000} us of CPU work between calls)" if spaced
                     else "tight loop (calls back to back)")  # fmt: skip
            print_table(f"{title}; gc off; ns per call; median of {runs} run(s)", rows, ours)
    finally:
        shutil.rmtree(slot_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    for key, rows in all_results.items():
        hb, step = rows.get("NVRx send_heartbeat()"), rows.get(ours)
        if isinstance(hb, dict) and isinstance(step, dict):
            ratio = hb["median"] / step["median"]
            verdict = "met" if ratio >= 20 else "NOT met"
            print(f"{key}: NVRx send_heartbeat() / client.step() = {ratio:.1f}x (goal >= 20x: {verdict})")
        if isinstance(step, dict):
            print(f"{key}: client.step() median {step['median']:.0f} ns (goal <= 1000 ns: "
                  f"{'met' if step['median'] <= 1000 else 'NOT met'})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(all_results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

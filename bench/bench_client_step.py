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

Methods measured in one process run in interleaved rounds (A B C A B C ...), so host noise on
this shared VM hits them alike. NVRx needs its own launcher, so its worker process also times
client.step() and an empty body, interleaved with the NVRx calls: that pair gives the ratio.
"net" is the median minus the timer floor (an empty body timed the same way) of the same process.

Usage: python bench/bench_client_step.py [--quick] [--no-nvrx] [--no-install] [--json FILE]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
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
from collections.abc import Callable, Iterator
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


def make_loop(call: str, namespace: dict[str, object]) -> Loop:
    """A timing loop with ``call`` inlined, so no method pays for an extra wrapper call."""
    ns = dict(namespace, _mono=time.monotonic_ns)
    exec(LOOP_TEMPLATE.format(call=call, spacing=SPACING_NS), ns)  # noqa: S102 - fixed local template
    return ns["loop"]  # type: ignore[return-value]


Loop = Callable[[int, bool], list[int]]
Stats = dict[str, float]
FLOOR = "timer floor (empty body)"
OURS = "supervisor client.step(i)"


def measure(methods: list[tuple[str, Loop, int]], runs: int, spaced: bool) -> dict[str, Stats]:
    """Per method: the median over ``runs`` interleaved rounds (order rotated each round) of each
    round's median and p99."""
    for _, loop, n in methods:
        loop(max(n // 10, 10), spaced)  # warm-up: specialisation, caches, first IPC connections
    medians: dict[str, list[int]] = {name: [] for name, _, _ in methods}
    p99s: dict[str, list[int]] = {name: [] for name, _, _ in methods}
    for r in range(runs):
        shift = r % len(methods)  # rotate the order: no method always follows the same one
        for name, loop, n in methods[shift:] + methods[:shift]:
            gc.disable()
            try:
                samples = loop(n, spaced)
            finally:
                gc.enable()
            samples.sort()
            medians[name].append(samples[len(samples) // 2])
            p99s[name].append(samples[min(len(samples) - 1, int(len(samples) * 0.99))])
    return {
        name: {
            "median": statistics.median(medians[name]),
            "p99": statistics.median(p99s[name]),
            "n": n,
            "runs": runs,
        }
        for name, _, n in methods
    }


# --- the methods ------------------------------------------------------------------------------


def ours_methods(n: int) -> list[tuple[str, Loop, int]]:
    from supervisor import client

    return [
        (FLOOR, make_loop("pass", {}), n),
        (OURS, make_loop("step(i)", {"step": client.step}), n),
        ("supervisor client.step(i, loss=x)", make_loop("step(i, loss=0.5)", {"step": client.step}), n),
        (
            "supervisor client.should_checkpoint()",
            make_loop("should()", {"should": client.should_checkpoint}),
            n,
        ),
        ("time.monotonic_ns() alone", make_loop("mono()", {"mono": time.monotonic_ns}), n),
    ]


UDP_RECEIVER = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
while True:
    s.recv(2048)
"""


@contextlib.contextmanager
def udp_method(n: int) -> Iterator[tuple[str, Loop, int]]:
    receiver = subprocess.Popen([sys.executable, "-c", UDP_RECEIVER], stdout=subprocess.PIPE, text=True)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert receiver.stdout is not None
        addr = ("127.0.0.1", int(receiver.stdout.readline()))
        loop = make_loop("sendto(payload, addr)", {"sendto": sock.sendto, "payload": b"x" * 32, "addr": addr})
        yield "UDP sendto 32 B to loopback", loop, n
    finally:
        sock.close()
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


@contextlib.contextmanager
def filetimer_method(n: int, workdir: Path) -> Iterator[tuple[str, Loop, int]]:
    from torch.distributed.elastic.timer import expires
    from torch.distributed.elastic.timer.file_based_local_timer import FileTimerClient

    fifo = workdir / "filetimer.fifo"
    server = subprocess.Popen(
        [sys.executable, "-c", FILETIMER_SERVER, str(fifo)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()
        timer_client = FileTimerClient(str(fifo))
        body = "with expires(after=60, scope='step', client=timer_client):\n            pass"
        batch_loop = make_loop(body, {"expires": expires, "timer_client": timer_client})
        batch = 100  # the 64 KiB FIFO holds ~150 blocks while the server sleeps 0.1 s between reads

        def loop(count: int, spaced: bool) -> list[int]:
            samples: list[int] = []
            while len(samples) < count:
                samples += batch_loop(min(batch, count - len(samples)), spaced)
                time.sleep(0.25)  # untimed: let the server drain the FIFO
            return samples

        yield "torch FileTimer expires(after=60, scope='step') block", loop, n
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


def bench_nvrx(n: int, n_ours: int, runs: int, spaced: bool, workdir: Path) -> dict[str, Stats]:
    out = workdir / f"nvrx-{'spaced' if spaced else 'tight'}.json"
    slot_dir = Path(tempfile.mkdtemp(prefix="bench-nvrx-slot-", dir=slot_parent()))
    cmd = [
        sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher", "--nproc-per-node=1",
        "--max-restarts=0", "--standalone", "--ft-initial-rank-heartbeat-timeout=600",
        "--ft-rank-heartbeat-timeout=300", "--ft-rank-section-timeouts=step:300",
        "--ft-rank-out-of-section-timeout=600", str(Path(__file__).resolve()),
        "--nvrx-worker", str(out), "--n", str(n), "--n-ours", str(n_ours), "--runs", str(runs),
    ] + (["--spaced"] if spaced else [])  # fmt: skip
    env = dict(os.environ, PYTHONPATH=nvrx_pythonpath(), SUPERVISOR_SLOT_DIR=str(slot_dir))
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    finally:
        shutil.rmtree(slot_dir, ignore_errors=True)
    if not out.exists():
        lines = (done.stdout + done.stderr).strip().splitlines()
        errors = [line for line in lines if "Error" in line and not line.startswith("20")]
        raise RuntimeError(
            f"ft_launcher run failed (exit {done.returncode}): {(errors or lines or ['?'])[-1]}"
        )
    return json.loads(out.read_text())


def nvrx_worker(out: Path, n: int, n_ours: int, runs: int, spaced: bool) -> None:
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    from supervisor import client

    client.step(0)  # set up this process's own slot before timing
    nv = RankMonitorClient()
    nv.init_workload_monitoring()
    methods = [
        (FLOOR, make_loop("pass", {}), n_ours),
        (OURS, make_loop("step(i)", {"step": client.step}), n_ours),
        ("NVRx send_heartbeat()", make_loop("hb()", {"hb": nv.send_heartbeat}), n),
        ("NVRx start_section+end_section('step')",
         make_loop("start('step')\n        end('step')", {"start": nv.start_section, "end": nv.end_section}), n),
    ]  # fmt: skip
    results = measure(methods, runs, spaced)
    nv.shutdown_workload_monitoring()
    out.write_text(json.dumps(results))


def slot_parent() -> str | None:
    return "/dev/shm" if os.path.isdir("/dev/shm") else None


# --- driver -----------------------------------------------------------------------------------


def print_table(title: str, rows: dict[str, Stats | str], floor: float, base: Stats | None) -> None:
    print(f"\n{title}")
    print(f"{'method':<58} {'median':>9} {'p99':>9} {'net':>9} {'x step':>8} {'x step net':>11}")
    base_net = base["median"] - floor if base else 0.0
    for name, r in rows.items():
        if isinstance(r, str):
            print(f"{name:<58} unavailable: {r}")
            continue
        net = r["median"] - floor
        ratio = f"{r['median'] / base['median']:.1f}x" if base and base["median"] else "-"
        ratio_net = f"{net / base_net:.1f}x" if base and base_net > 0 else "-"
        print(f"{name:<58} {r['median']:>9,.0f} {r['p99']:>9,.0f} {net:>9,.0f} {ratio:>8} {ratio_net:>11}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer calls and rounds")
    parser.add_argument("--no-nvrx", action="store_true", help="skip the NVIDIA resiliency-ext baseline")
    parser.add_argument("--no-install", action="store_true", help="do not pip-install NVRx into bench/out")
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--nvrx-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--n-ours", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--spaced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.nvrx_worker:
        nvrx_worker(args.nvrx_worker, args.n, args.n_ours, args.runs, args.spaced)
        return 0

    runs = 3 if args.quick else 5
    n_cheap, n_ipc, n_timer = (20_000, 2_000, 300) if args.quick else (100_000, 10_000, 1_500)
    OUT.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="bench-client-", dir=OUT))
    slot_dir = Path(tempfile.mkdtemp(prefix="bench-client-slot-", dir=slot_parent()))
    os.environ["SUPERVISOR_SLOT_DIR"] = str(slot_dir)
    nvrx_problem = "skipped (--no-nvrx)" if args.no_nvrx else ensure_nvrx(not args.no_install)
    results: dict[str, dict[str, dict[str, Stats | str]]] = {}
    try:
        from supervisor import client

        client.step(0)  # set up the slot before timing
        for spaced in (False, True):
            scale = 5 if spaced else 1  # spaced calls cost ~20 us each: fewer of them
            key = "spaced" if spaced else "tight"
            main_rows: dict[str, Stats | str] = {}
            with contextlib.ExitStack() as stack:
                methods = ours_methods(n_cheap // scale)
                baselines: list[tuple[str, Callable[[], contextlib.AbstractContextManager[tuple[str, Loop, int]]]]] = [
                    ("UDP sendto 32 B to loopback", functools.partial(udp_method, n_ipc // scale)),
                    ("torch FileTimer expires(after=60, scope='step') block",
                     functools.partial(filetimer_method, n_timer // scale, workdir)),
                ]  # fmt: skip
                for name, make in baselines:
                    try:
                        methods.append(stack.enter_context(make()))
                    except Exception as exc:  # one broken baseline must not hide the others
                        main_rows[name] = f"{type(exc).__name__}: {exc}"
                main_rows = {**measure(methods, runs, spaced), **main_rows}
            worker_rows: dict[str, Stats | str] = {}
            if nvrx_problem:
                worker_rows["NVRx send_heartbeat()"] = nvrx_problem
            else:
                try:
                    worker_rows.update(bench_nvrx(n_ipc // scale, n_cheap // scale, runs, spaced, workdir))
                except Exception as exc:
                    worker_rows["NVRx send_heartbeat()"] = f"{type(exc).__name__}: {exc}"
            results[key] = {"main": main_rows, "nvrx_worker": worker_rows}
            what = f"{SPACING_NS // 1000} us of CPU work between calls" if spaced else "calls back to back"
            for part, rows in (("this process", main_rows), ("NVRx worker under ft_launcher", worker_rows)):
                floor = rows.get(FLOOR)
                base = rows.get(OURS)
                print_table(
                    f"{key} loop ({what}), {part}: ns per call, gc off, median of {runs} interleaved rounds",
                    rows,
                    floor["median"] if isinstance(floor, dict) else 0.0,
                    base if isinstance(base, dict) else None,
                )
    finally:
        shutil.rmtree(slot_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)

    print()
    for key, parts in results.items():
        step, floor = parts["main"].get(OURS), parts["main"].get(FLOOR)
        if isinstance(step, dict) and isinstance(floor, dict):
            net = step["median"] - floor["median"]
            print(f"{key}: client.step() median {step['median']:.0f} ns, {net:.0f} ns net of the timer floor "
                  f"(goal <= 1000 ns: {'met' if step['median'] <= 1000 else 'NOT met'})")  # fmt: skip
        w = parts["nvrx_worker"]
        hb, step, floor = w.get("NVRx send_heartbeat()"), w.get(OURS), w.get(FLOOR)
        if isinstance(hb, dict) and isinstance(step, dict) and isinstance(floor, dict):
            raw = hb["median"] / step["median"]
            net = (hb["median"] - floor["median"]) / max(1.0, step["median"] - floor["median"])
            print(f"{key}: NVRx send_heartbeat() / client.step(), same process, interleaved: {raw:.1f}x raw, "
                  f"{net:.1f}x net (goal >= 20x: {'met' if raw >= 20 else 'met net of the timer floor' if net >= 20 else 'NOT met'})")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

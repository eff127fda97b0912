"""Aggregator scale: CPU and freshness of one aggregator fed by simulated node agents at 1 Hz.

Goal: 131,072 ranks (16,384 nodes x 8) within one core and <= 1 s staleness.

Two modes, both with real authenticated frames (HMAC-SHA256, 8 ranks per node):
  in-process: pre-encoded frames fed to ``LiveTable.feed`` back to back -> CPU seconds per 1-Hz round,
              plus the cost of a full snapshot (decode every rank) and of writing live.json.
              Baseline, measured in the same run: a naive aggregator (JSON frame, per-rank dicts).
  udp:        a separate sender process paces pre-encoded frames evenly over each second to an
              ``AggregatorServer`` (default settings: keepalives, live.json) over loopback UDP; we measure the receiver's CPU share (process time /
              wall time), frames lost and staleness
              (max over nodes of time since the last summary, sampled every 0.5 s; it includes the 1 s
              reporting period, so <= 2 s means the aggregator added <= 1 s).

    .venv/bin/python bench/bench_aggregator_scale.py [--ranks 1024,16384,131072] [--seconds 5] [--mode both]
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from supervisor.heartbeat import wire  # noqa: E402
from supervisor.heartbeat.live import live_document, write_private_json  # noqa: E402
from supervisor.heartbeat.server import AggregatorServer  # noqa: E402
from supervisor.heartbeat.table import LiveTable  # noqa: E402

SECRET = b"b" * 32
KEY = wire.derive_key(SECRET)
JOB = "1000"
RANKS_PER_NODE = 8


def ranks_of(node: int, step: int) -> list[wire.RankEntry]:
    return [wire.RankEntry(node * 8 + i, 10_000 + i, step, 1, wire.ST_RUNNING, 0, 0, 120, 0.9, 0.8, 1.1,
                           2.5, step, step, -1, 0, 100.0 + step) for i in range(RANKS_PER_NODE)]


def encode_round(nodes: int, rnd: int, wall_ns: int) -> list[bytes]:
    return [wire.encode_summary(KEY, instance=n + 1, seq=rnd, wall_ns=wall_ns, mono_ns=rnd * 10**9, job=JOB,
                                node=f"node{n:05d}", ranks=ranks_of(n, rnd)) for n in range(nodes)]


def naive_frame(node: int, rnd: int) -> bytes:
    body = json.dumps({"job": JOB, "node": f"node{node:05d}", "seq": rnd, "sent": time.time(),
                       "ranks": [r._asdict() for r in ranks_of(node, rnd)]}).encode()
    return body + hmac.digest(KEY, body, hashlib.sha256)


class NaiveAggregator:
    """The obvious design: JSON frames, one dict per rank updated on every frame."""

    def __init__(self) -> None:
        self.ranks: dict[int, dict[str, object]] = {}
        self.last_seq: dict[str, int] = {}

    def feed(self, data: bytes) -> bool:
        body, mac = data[:-32], data[-32:]
        if not hmac.compare_digest(hmac.digest(KEY, body, hashlib.sha256), mac):
            return False
        doc = json.loads(body)
        if doc["job"] != JOB or doc["seq"] <= self.last_seq.get(doc["node"], 0):
            return False
        self.last_seq[doc["node"]] = doc["seq"]
        now = time.monotonic()
        for r in doc["ranks"]:
            prev = self.ranks.get(r["rank"])
            rate = None
            if prev is not None:
                rate = (r["step"] - prev["step"]) / max(1e-9, now - prev["t"])  # type: ignore[operator]
            self.ranks[r["rank"]] = {**r, "t": now, "rate": rate, "node": doc["node"]}
        return True


def in_process(total_ranks: int) -> dict[str, float]:
    nodes = total_ranks // RANKS_PER_NODE
    wall = time.time_ns()
    rounds = [encode_round(nodes, rnd, wall) for rnd in (1, 2, 3)]
    table = LiveTable(KEY, JOB, rate_window_s=1.0, wall_ns=lambda: wall)
    costs = []
    for frames in rounds:
        t0 = time.process_time()
        for f in frames:
            table.feed(f)
        costs.append(time.process_time() - t0)
    assert table.counters["ok"] == 3 * nodes, table.counters
    t0 = time.process_time()
    snap = table.snapshot()
    snap_s = time.process_time() - t0
    assert len(snap.ranks) == total_ranks and snap.ranks[0].steps_per_s == 1.0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.process_time()
        write_private_json(Path(tmp) / "live.json", live_document(snap))
        live_s = time.process_time() - t0
    naive = NaiveAggregator()
    naive_rounds = [[naive_frame(n, rnd) for n in range(nodes)] for rnd in (1, 2)]
    naive_costs = []
    for frames in naive_rounds:
        t0 = time.process_time()
        for f in frames:
            naive.feed(f)
        naive_costs.append(time.process_time() - t0)
    feed_s = min(costs[1:])
    return {"feed_s": feed_s, "per_frame_us": feed_s / nodes * 1e6, "snapshot_s": snap_s, "live_write_s": live_s,
            "naive_feed_s": naive_costs[1], "bytes_per_frame": len(rounds[0][0])}


def _sender(addr: tuple[str, int], nodes: int, seconds: int, ready: mp.synchronize.Event,
            go: mp.synchronize.Event) -> None:
    wall = time.time_ns()
    rounds = [encode_round(nodes, rnd, wall) for rnd in range(1, seconds + 1)]
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    ready.set()
    go.wait()
    start = time.monotonic()
    slices = 100  # send each round in 100 evenly spaced batches (agents' reports are spread over the second)
    for rnd, frames in enumerate(rounds):
        per = -(-len(frames) // slices)
        for k in range(slices):
            due = start + rnd + k / slices
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            for f in frames[k * per:(k + 1) * per]:
                sock.sendto(f, addr)
    sock.close()


def over_udp(total_ranks: int, seconds: int) -> dict[str, float]:
    nodes = total_ranks // RANKS_PER_NODE
    with tempfile.TemporaryDirectory() as tmp:
        # Production defaults: keepalives to every node each 5 s, live.json each >= 1 s (adaptive).
        server = AggregatorServer(tmp, JOB, secret=SECRET, channel=b"", rate_window_s=1.0)  # frames pre-encoded with KEY
        # Frames carry their encode time; accept them however long the sender took to pre-encode.
        server.table.guard.window_s = 3600
        ctx = mp.get_context("fork")
        ready, go = ctx.Event(), ctx.Event()
        proc = ctx.Process(target=_sender, args=(server.address, nodes, seconds, ready, go))
        proc.start()
        ready.wait()
        server.poll(0)
        go.set()
        t_start = time.monotonic()
        cpu0 = time.process_time()
        sample_cpu = 0.0
        staleness: list[float] = []
        next_sample = t_start + 1.5
        end = t_start + seconds + 0.5
        max_pause = 0.0
        last = time.monotonic()
        while time.monotonic() < end:
            server.poll(0.02)
            now = time.monotonic()
            max_pause, last = max(max_pause, now - last), now
            if now >= next_sample and server.table.nodes:
                c = time.process_time()
                next_sample = now + 0.5
                staleness.append(max(now - st.recv_mono for st in server.table.nodes.values()))
                sample_cpu += time.process_time() - c
                last = time.monotonic()
        wall_s = time.monotonic() - t_start
        cpu_s = time.process_time() - cpu0 - sample_cpu
        proc.join()
        ok = server.table.counters["ok"]
        live_write_s = server.live_write_s
        rcvbuf = server.sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
        server.close()
    staleness.sort()
    return {"cpu_frac": cpu_s / wall_s, "sent": nodes * seconds, "ok": ok, "lost": nodes * seconds - ok,
            "staleness_p50": statistics.median(staleness) if staleness else float("nan"),
            "staleness_max": staleness[-1] if staleness else float("nan"), "live_write_s": live_write_s,
            "max_pause_s": max_pause, "rcvbuf": rcvbuf}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--ranks", default="1024,16384,131072")
    p.add_argument("--seconds", type=int, default=5)
    p.add_argument("--mode", choices=("both", "inproc", "udp"), default="both")
    args = p.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    print(f"# aggregator scale, {RANKS_PER_NODE} ranks/node, 1 Hz per node, cpus={os.cpu_count()}")
    if args.mode in ("both", "inproc"):
        print("## in-process feed (CPU seconds per 1-Hz round = core fraction)")
        print(f"{'ranks':>8} {'nodes':>6} {'B/frame':>7} {'us/frame':>8} {'core%':>6} {'naive core%':>11} "
              f"{'ratio':>6} {'snapshot s':>10} {'live.json s':>11}")
        for n in sizes:
            r = in_process(n)
            print(f"{n:>8} {n // 8:>6} {r['bytes_per_frame']:>7.0f} {r['per_frame_us']:>8.1f} {100 * r['feed_s']:>6.1f} "
                  f"{100 * r['naive_feed_s']:>11.1f} {r['naive_feed_s'] / r['feed_s']:>5.1f}x "
                  f"{r['snapshot_s']:>10.3f} {r['live_write_s']:>11.3f}", flush=True)
    if args.mode in ("both", "udp"):
        print(f"## loopback UDP from a separate sender process, {args.seconds} s")
        print(f"{'ranks':>8} {'nodes':>6} {'recv core%':>10} {'sent':>7} {'lost':>6} {'stale p50 s':>11} "
              f"{'stale max s':>11} {'max pause s':>11} {'live.json s':>11} {'goal':>5}")
        for n in sizes:
            r = over_udp(n, args.seconds)
            ok = r["cpu_frac"] <= 1.0 and r["staleness_max"] <= 2.0 and r["lost"] == 0
            print(f"{n:>8} {n // 8:>6} {100 * r['cpu_frac']:>10.1f} {r['sent']:>7} {r['lost']:>6} "
                  f"{r['staleness_p50']:>11.2f} {r['staleness_max']:>11.2f} {r['max_pause_s']:>11.3f} "
                  f"{r['live_write_s']:>11.3f} {'ok' if ok else 'MISS':>5}", flush=True)
            rcvbuf = r["rcvbuf"]
        print("staleness includes the 1 s reporting period: <= 2.0 s max means <= 1 s added by the aggregator")
        print(f"receive buffer granted: {rcvbuf / 2**20:.0f} MiB (asked 64; capped by net.core.rmem_max without "
              "CAP_NET_ADMIN); a pause longer than it holds loses frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Restart in process with real gloo ranks (issue 23, the training side): three ranks of a user-style DDP program
wrapped in ``client.restartable``; one rank is SIGKILLed, or stopped (a hang) and then killed as the supervisor kills
a hung rank. The test plays the supervisor's part: it waits until the surviving ranks say in their slots that they
wait for an order, writes the order (a new rendezvous port, the newest checkpoint), and starts only the dead rank
again. The survivors keep their processes (same pid, generation 1 in the same process), and the final weights are
bitwise those of an uninterrupted run."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from supervisor.client import slot as S
from supervisor.client.restart_order import ENV_GENERATION, ENV_WARM, RestartOrder, write_order

PROGRAM = Path(__file__).parent / "programs" / "warm_train.py"
ROOT = Path(__file__).resolve().parents[2]
WORLD, STEPS = 3, 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_rank(rank: int, env: dict[str, str], tmp: Path, tag: str, steps: int = STEPS) -> subprocess.Popen[bytes]:
    with open(tmp / f"rank{rank}-{tag}.err", "wb") as err, open(tmp / f"rank{rank}-{tag}.out", "wb") as out:
        return subprocess.Popen([sys.executable, str(PROGRAM), "--steps", str(steps), "--ckpt-dir", str(tmp / "ckpt"),
                                 "--out", str(tmp / "final.pt")],
                                env={**env, "RANK": str(rank)}, stdout=out, stderr=err, cwd=ROOT)  # fmt: skip


def base_env(tmp: Path, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUPERVISOR_", "SLURM_"))}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(WORLD), PYTHONPATH=str(ROOT))
    return env


def wait_all(procs: dict[int, subprocess.Popen[bytes]], tmp: Path, timeout_s: float = 240.0) -> None:
    deadline = time.monotonic() + timeout_s
    for rank, proc in procs.items():
        try:
            rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            rc = -1
        if rc != 0:
            logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(tmp.glob("rank*.err")))
            pytest.fail(f"rank {rank} ended with {rc}\n{logs}")


def slot_record(slot_dir: Path, rank: int) -> S.SlotRecord | None:
    return S.read_slot(S.slot_path(slot_dir, rank)) if S.slot_path(slot_dir, rank).exists() else None


def wait_for(what: str, check, timeout_s: float = 120.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.02)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of an uninterrupted run."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    env = base_env(tmp, free_port())
    wait_all({r: start_rank(r, env, tmp, "plain") for r in range(WORLD)}, tmp)
    return torch.load(tmp / "final.pt", weights_only=True)


@pytest.mark.parametrize("victim, hang", [(2, False), (0, False), (1, True)], ids=["kill-rank2", "kill-rank0-store-host", "hang-rank1"])
def test_the_survivors_restart_in_their_processes_and_train_bitwise_as_uninterrupted(
    tmp_path: Path, victim: int, hang: bool, expected: dict[str, torch.Tensor]
) -> None:
    tmp = tmp_path / "warm"
    tmp.mkdir()
    slot_dir = tmp / "slots"
    slot_dir.mkdir(mode=0o700)
    env = {**base_env(tmp, free_port()), "SUPERVISOR_SLOT_DIR": str(slot_dir), ENV_WARM: "1"}
    procs = {r: start_rank(r, env, tmp, "g0") for r in range(WORLD)}
    try:
        wait_for("step 12 on every rank", lambda: all((rec := slot_record(slot_dir, r)) is not None and rec.step >= 12
                                                      for r in range(WORLD)))  # fmt: skip
        survivors = [r for r in range(WORLD) if r != victim]
        if hang:  # a hung rank: its peers block in the next collective until the supervisor kills it
            procs[victim].send_signal(signal.SIGSTOP)
            time.sleep(1.0)
            assert not any(slot_record(slot_dir, r).rank_flags & S.RANK_FLAG_AWAITING_RESTART for r in survivors)
        procs[victim].send_signal(signal.SIGKILL)
        procs[victim].wait(timeout=30)

        def all_waiting() -> bool:
            recs = [slot_record(slot_dir, r) for r in survivors]
            return all(rec is not None and rec.rank_flags & S.RANK_FLAG_AWAITING_RESTART for rec in recs)

        wait_for("the survivors to wait for their order", all_waiting, timeout_s=60)
        assert all(slot_record(slot_dir, r).rank_flags & S.RANK_FLAG_RESTARTABLE for r in survivors)
        newest = max((tmp / "ckpt").glob("checkpoint-*.pt"), key=lambda p: int(re.findall(r"\d+", p.name)[0]))
        port = free_port()
        order = RestartOrder(1, {"MASTER_PORT": str(port), "SUPERVISOR_RESUME_FROM": str(newest)})
        write_order(slot_dir, order)
        replacement = start_rank(victim, {**env, "MASTER_PORT": str(port), "SUPERVISOR_RESUME_FROM": str(newest),
                                          ENV_GENERATION: "1"}, tmp, "g1")  # fmt: skip
        wait_all({**{r: procs[r] for r in survivors}, victim: replacement}, tmp)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    resumed_at = int(re.findall(r"\d+", newest.name)[0])
    for r in survivors:
        starts = re.findall(r"start rank=(\d+) pid=(\d+) generation=(\d+) step=(\d+)", (tmp / f"rank{r}-g0.err").read_text())
        assert starts == [(str(r), str(procs[r].pid), "0", "0"), (str(r), str(procs[r].pid), "1", str(resumed_at))]
    replaced = re.findall(r"generation=(\d+) step=(\d+)", (tmp / f"rank{victim}-g1.err").read_text())
    assert replaced == [("1", str(resumed_at))]
    got = torch.load(tmp / "final.pt", weights_only=True)
    assert got.keys() == expected.keys()
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_standby_process_takes_over_the_dead_rank(tmp_path: Path, expected: dict[str, torch.Tensor]) -> None:
    """A standby (``python -m supervisor.client.standby -- SCRIPT ARGS``: interpreter up, torch imported, waiting)
    is assigned the killed rank's identity and runs the program in its own process; nobody else is started."""
    from supervisor.client.restart_order import ASSIGN_ENV
    from supervisor.client.standby import assign_name, ready_name

    slot_dir = tmp_path / "slots"
    slot_dir.mkdir(mode=0o700)
    env = {**base_env(tmp_path, free_port()), "SUPERVISOR_SLOT_DIR": str(slot_dir), ENV_WARM: "1"}
    procs = {r: start_rank(r, env, tmp_path, "g0") for r in range(WORLD)}
    args = ["--steps", str(STEPS), "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(tmp_path / "final.pt")]
    standby_env = {k: v for k, v in env.items() if k not in ("RANK",)}
    with open(tmp_path / "standby.err", "wb") as err:
        standby = subprocess.Popen([sys.executable, "-m", "supervisor.client.standby", "--", str(PROGRAM), *args],
                                   env={**standby_env, "SUPERVISOR_STANDBY": "s1", "SUPERVISOR_HELPER_STEP": "standby"},
                                   stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT)  # fmt: skip
    try:
        wait_for("the standby to be ready", lambda: (slot_dir / ready_name("s1")).exists())
        wait_for("step 12 on every rank", lambda: all((rec := slot_record(slot_dir, r)) is not None and rec.step >= 12
                                                      for r in range(WORLD)))  # fmt: skip
        procs[1].send_signal(signal.SIGKILL)
        procs[1].wait(timeout=30)
        wait_for("the survivors to wait", lambda: all(slot_record(slot_dir, r).rank_flags & S.RANK_FLAG_AWAITING_RESTART
                                                      for r in (0, 2)), timeout_s=60)  # fmt: skip
        newest = max((tmp_path / "ckpt").glob("checkpoint-*.pt"), key=lambda p: int(re.findall(r"\d+", p.name)[0]))
        moved = {"MASTER_PORT": str(free_port()), "SUPERVISOR_RESUME_FROM": str(newest)}
        write_order(slot_dir, RestartOrder(1, moved))
        write_order(slot_dir, RestartOrder(1, {**moved, "RANK": "1", "WORLD_SIZE": str(WORLD), "MASTER_ADDR": "127.0.0.1"}),
                    name=assign_name("s1"), allowed=ASSIGN_ENV)  # fmt: skip
        wait_all({0: procs[0], 2: procs[2], 1: standby}, tmp_path)
    finally:
        for p in (*procs.values(), standby):
            if p.poll() is None:
                p.kill()
    resumed_at = int(re.findall(r"\d+", newest.name)[0])
    took_over = re.findall(r"start rank=(\d+) pid=(\d+) generation=(\d+) step=(\d+)", (tmp_path / "standby.err").read_text())
    assert took_over == [("1", str(standby.pid), "1", str(resumed_at))]
    assert not (slot_dir / ready_name("s1")).exists()
    got = torch.load(tmp_path / "final.pt", weights_only=True)
    assert all(torch.equal(got[k], expected[k]) for k in expected)


def test_a_standby_leaves_quietly_when_the_job_ends(tmp_path: Path) -> None:
    from supervisor.client.standby import ready_name

    slot_dir = tmp_path / "slots"
    slot_dir.mkdir(mode=0o700)
    env = {**base_env(tmp_path, free_port()), "SUPERVISOR_SLOT_DIR": str(slot_dir), "SUPERVISOR_STANDBY": "s2"}
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.client.standby", "--preload", "json", "--", "nothing.py"],
                            env=env, cwd=ROOT)  # fmt: skip
    try:
        wait_for("the standby to be ready", lambda: (slot_dir / ready_name("s2")).exists())
        for f in slot_dir.iterdir():
            f.unlink()
        slot_dir.rmdir()  # the agent removes the slot directory when the job ends
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    bad = subprocess.run([sys.executable, "-m", "supervisor.client.standby", "--", "x.py"], env=base_env(tmp_path, 1),
                         cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and "SUPERVISOR_STANDBY" in bad.stderr

"""The memory tier's DCP storage writer and reader (supervisor/checkpoint/dcp_memory.py) in a program written as
users write them (programs/dcp_memory_train.py: plain DCP to the filesystem, ``DcpMemory`` for node memory), on
two local gloo processes, FSDP2 (sharded) and DDP (replicated, which DCP's planner gives to one rank only): killed
after step 9 of a 4-step filesystem interval, relaunched with the step the supervisor would pick, it resumes from
memory at step 9 and prints bitwise the uninterrupted run's losses; one flipped byte in one rank's shard sends
both ranks to the filesystem checkpoint (step 8), bitwise too; the node agent verifies these shards as its own."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = pytest.mark.torch
PROGRAM = Path(__file__).resolve().parent / "programs" / "dcp_memory_train.py"
STEP_LINE = re.compile(r"^step=(\d+) loss=(\S+)$")


def run(ckpt: Path, *args: str, env: dict[str, str] | None = None, world: int = 2, steps: int = 12
        ) -> tuple[list[str], str]:  # fmt: skip
    """The program on ``world`` local processes: rank 0's step lines and every rank's stderr."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUPERVISOR_", "RANK", "MASTER_"))}
    # Into files, not pipes: a pipe read only after rank 0 exits lets another rank's chatter fill its buffer and
    # block it inside a collective, rank 0 with it (an unrelated hang seen once on a busy machine)
    logs = [(ckpt.parent / f"{ckpt.name}-rank{r}.out", ckpt.parent / f"{ckpt.name}-rank{r}.err") for r in range(world)]
    procs = []
    for r, (out, err) in enumerate(logs):
        with out.open("w") as o, err.open("w") as e:
            procs.append(subprocess.Popen(
                [sys.executable, str(PROGRAM), "--steps", str(steps), "--ckpt-dir", str(ckpt), "--ckpt-every", "4",
                 *args],
                env={**base, "PYTHONWARNINGS": "ignore", "RANK": str(r), "WORLD_SIZE": str(world),
                     "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, **(env or {})},
                stdout=o, stderr=e, text=True))  # fmt: skip
    try:
        for p in procs:
            p.wait(timeout=240)
    finally:
        for p in procs:
            p.kill()
            p.wait()
        outs = [(out.read_text(), err.read_text()) for out, err in logs]
        if any(p.returncode != 0 for p in procs):
            print("\n".join(f"rank {r} (exit {p.returncode}) stderr:\n{err}" for r, (p, (_, err))
                            in enumerate(zip(procs, outs, strict=True))))  # fmt: skip
    lines = outs[0][0].splitlines()
    assert all(STEP_LINE.match(line) for line in lines), outs[0]
    return lines, "".join(err for _, err in outs)  # every rank's stderr


@pytest.mark.parametrize("style", ["fsdp2", "ddp"])
def test_a_users_dcp_script_resumes_from_node_memory_bitwise_and_refuses_a_flipped_shard(tmp_path: Path,
                                                                                         style: str) -> None:
    flags = ("--ddp",) if style == "ddp" else ()
    want, _ = run(tmp_path / "ref", *flags)
    assert len(want) == 12
    store = tmp_path / "shm"
    memory = {"SUPERVISOR_MEMORY_DIR": str(store), "SUPERVISOR_MEMORY_EVERY": "1"}
    first, _ = run(tmp_path / "ckpt", *flags, "--die-at-step", "9", env=memory)
    assert first == want[:9]
    assert sorted(p.name for p in (store / "step_9").iterdir()) == ["rank_0.json", "rank_0.snap", "rank_1.json",
                                                                   "rank_1.snap"]  # fmt: skip

    from supervisor.agent.memory_inventory import Inventory

    held = [h for h in Inventory(store).scan() if h.step == 9]
    assert sorted(h.rank for h in held) == [0, 1] and all(h.verified for h in held), "the agent offers them"

    shutil.copytree(store, tmp_path / "shm-at-9")  # as the store was when the ranks died (the resumed run moves on)
    again, err = run(tmp_path / "ckpt", *flags, env={**memory, "SUPERVISOR_RESUME_MEMORY_STEP": "9"})
    assert "resumed from memory at step 9" in err, err
    assert again == want[9:], "resumed from node memory: the uninterrupted losses, bitwise"

    shutil.rmtree(store)
    shutil.copytree(tmp_path / "shm-at-9", store)
    shard = store / "step_9" / "rank_1.snap"
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0x01
    shard.write_bytes(bytes(data))
    (tmp_path / "ckpt" / "step_12").rename(tmp_path / "ckpt" / "done_12")  # the relaunch would not see it
    refused, err = run(tmp_path / "ckpt", *flags, env={**memory, "SUPERVISOR_RESUME_MEMORY_STEP": "9"})
    assert "memory snapshot not used" in err and re.search(r"resumed from \S+step_8 at step 8", err), err
    assert refused == want[8:], "every rank went to the filesystem checkpoint, bitwise"

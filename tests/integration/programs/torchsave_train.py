"""A training program written the way users write them: plain ``torch.save``/``torch.load`` and gloo DDP.

It never calls the supervisor's client unless ``--client`` is given (the rows that need heartbeats: live hang,
NaN, loss spike), and it knows nothing of manifests: rank 0 writes ``checkpoint-<step>.pt`` straight into
``--ckpt-dir`` (not atomically, as most programs do) and every rank waits at a barrier. On start it resumes from
``$SUPERVISOR_RESUME_FROM`` when the supervisor set it (the documented environment contract), else from the
highest-numbered file in ``--ckpt-dir``, and rank 0 prints ``resumed from PATH at step N``. Rank 0 prints
``step=N loss=X`` per step.

The ``--*`` fault flags below exist for the fault matrix (tests/integration/test_fault_matrix_*.py); one-shot
faults leave a marker file in ``--ckpt-dir`` so a relaunch does not repeat them.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import re
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--pg-timeout", type=float, default=300.0, help="gloo collective timeout (s)")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--client", action="store_true", help="report steps and losses to the supervisor's client")
    # faults (tests)
    p.add_argument("--crash-at-start-rank", type=int, default=-1, help="this rank raises at every start")
    p.add_argument("--cuda-assert-rank", type=int, default=-1,
                   help="this rank fails its first step of every start as torch does on a device-side assert")
    p.add_argument("--crash-on-bad-node", type=int, default=0,
                   help="whichever rank runs on the node named in CKPT_DIR/bad-node raises at this step")
    p.add_argument("--xid-on-bad-node", type=int, default=0,
                   help="one-shot: the rank on the node named in CKPT_DIR/bad-node prints an Xid line, exits 1")
    p.add_argument("--hang-at-step", type=int, default=0, help="one-shot: --hang-rank sleeps forever here")
    p.add_argument("--hang-rank", type=int, default=1)
    p.add_argument("--save-phase", action="store_true",
                   help="with --client: the save and its barrier run inside client.phase('checkpoint')")
    p.add_argument("--hang-before-save", type=int, default=0,
                   help="one-shot: at this checkpoint step --hang-rank sleeps forever just before the save, while "
                        "its peers enter the save (and its barrier)")
    p.add_argument("--nan-at-step", type=int, default=0)
    p.add_argument("--slow-rank", type=int, default=-1,
                   help="this rank's forward pass takes --slow-s longer (a slow GPU: the peers wait for it)")
    p.add_argument("--slow-s", type=float, default=0.0)
    p.add_argument("--slow-from-step", type=int, default=0, help="the slow rank is slow from this step on")
    p.add_argument("--spike-at-step", type=int, default=0, help="from here, 3 steps' losses are 1e6x (not NaN)")
    p.add_argument("--print-at-step", type=int, default=0,
                   help="one-shot: rank 1 prints --print-text (its data, a message: anything), then raises")
    p.add_argument("--print-text", default="")
    p.add_argument("--abort-at-exit-rank", type=int, default=-1,
                   help="this rank aborts in the interpreter's teardown, after the training ended (a library's "
                        "destructor: gloo's abort at exit)")
    return p.parse_args()


class AbortingDestructor:
    """What some libraries leave behind: an object whose destructor aborts when the interpreter tears down."""

    def __del__(self) -> None:
        os.abort()


def once(ckpt_dir: Path, name: str) -> bool:
    """True the first time a one-shot fault ``name`` fires in this checkpoint directory's campaign."""
    marker = ckpt_dir / f".fault-{name}"
    try:
        marker.touch(exist_ok=False)
        return True
    except FileExistsError:
        return False


def bad_node(ckpt_dir: Path) -> str:
    try:
        return (ckpt_dir / "bad-node").read_text().strip()
    except OSError:
        return ""


def latest(ckpt_dir: Path) -> Path | None:
    found = []
    for name in glob.glob(str(ckpt_dir / "checkpoint-*.pt")):
        m = re.search(r"checkpoint-(\d+)\.pt$", name)
        if m:
            found.append((int(m.group(1)), Path(name)))
    return max(found)[1] if found else None


def device_side_assert() -> None:
    """What torch 2.11 on an H200 printed for an index out of range in a CUDA kernel (the kernel's assertion on
    stderr, then the exception; tests/fixtures/gpu_messages/messages.json, "device_side_assert"). This machine has
    no GPU: the words and the exception's type are torch's, the failure is simulated."""
    print('/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [0,0,0], thread: [0,0,0] '
          'Assertion `-sizes[i] <= index && index < sizes[i] && "index out of bounds"` failed.', file=sys.stderr,
          flush=True)
    raise torch.AcceleratorError(
        "CUDA error: device-side assert triggered\n"
        "Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html "
        "for more information.\n"
        "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might "
        "be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
        "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


_LEFT_BEHIND = None


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)
    node = os.environ.get("SLURMD_NODENAME", "")
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if rank == args.abort_at_exit_rank:
        global _LEFT_BEHIND
        _LEFT_BEHIND = AbortingDestructor()  # collected with the module's globals, after atexit
    if rank == args.crash_at_start_rank:
        raise ValueError("config key 'lr_schedule' is missing (a bug that crashes every start)")
    if world > 1:
        port = 20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=timedelta(seconds=args.pg_timeout))
    client = None
    if args.client:
        from supervisor import client as supervisor_client

        client = supervisor_client
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, args.hidden), nn.Tanh(), nn.Linear(args.hidden, 1))
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model)
        if client is not None:
            client.watch_ddp(model)  # own time per step: the gradient all-reduce's wait for peers left out
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    start = 0
    resume = os.environ.get("SUPERVISOR_RESUME_FROM") or None
    path = Path(resume) if resume else latest(ckpt_dir)
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"])
        if rank == 0:
            print(f"resumed from {path} at step {start}", file=sys.stderr, flush=True)
    gen = torch.Generator().manual_seed(args.seed * 1000 + rank)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(32, 16, generator=gen)
        out = model(x)
        if rank == args.slow_rank and step >= args.slow_from_step:
            time.sleep(args.slow_s)  # slower compute on this rank only
        loss = ((out - x.sum(dim=1, keepdim=True).sin()) ** 2).mean()
        if rank == args.cuda_assert_rank and step == start + 1:
            device_side_assert()
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = float(loss.item())
        if args.nan_at_step and step >= args.nan_at_step:
            value = float("nan")
        if args.spike_at_step and args.spike_at_step <= step < args.spike_at_step + 3:
            value *= 1e6
        if client is not None:
            client.step(step, loss=value)
        if rank == 0:
            print(f"step={step} loss={value!r}", flush=True)
        if step in (args.crash_on_bad_node, args.xid_on_bad_node) and node == bad_node(ckpt_dir):
            if step == args.crash_on_bad_node:
                raise OSError(f"cannot open /local/scratch/{node}/cache: Input/output error")
            if once(ckpt_dir, "xid"):
                print("NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, GPU has fallen off the bus.", flush=True)
                return 1
        if args.print_at_step and step == args.print_at_step and rank == 1 and once(ckpt_dir, "print"):
            print(args.print_text.encode().decode("unicode_escape"), flush=True)  # "\r", "\n" as the text's own
            raise ValueError("a bad sample")
        if args.hang_at_step and step == args.hang_at_step and rank == args.hang_rank and once(ckpt_dir, "hang"):
            while True:  # a live hang: the process runs (sleeps), it never steps again
                time.sleep(3600)
        time.sleep(args.step_time)
        asked = stop = False
        if client is not None:  # every rank must take the same decision, or the barrier below deadlocks
            flags = torch.tensor([int(client.should_checkpoint()), int(client.should_stop())])
            if world > 1:
                dist.all_reduce(flags, op=dist.ReduceOp.MAX)
            asked, stop = bool(flags[0]), bool(flags[1])
        if (args.ckpt_every and step % args.ckpt_every == 0) or asked or stop:
            if step == args.hang_before_save and rank == args.hang_rank and once(ckpt_dir, "hang-before-save"):
                while True:  # stuck on the way to the save: its peers wait in the save's barrier
                    time.sleep(3600)
            with (client.phase("checkpoint") if client is not None and args.save_phase else contextlib.nullcontext()):
                if rank == 0:
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                               ckpt_dir / f"checkpoint-{step}.pt")
                if world > 1:
                    dist.barrier()
        if stop:
            break
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())

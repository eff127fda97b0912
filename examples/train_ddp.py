"""A small resumable DDP (or FSDP2) training program (torch, gloo, CPU) that shows the supervisor contract.

    python examples/train_ddp.py --steps 100 --ckpt-dir /tmp/ckpt --ckpt-every 10 --seed 1
    torchrun --nproc-per-node 2 examples/train_ddp.py ...      # or: srun -n 2 python examples/train_ddp.py ...
    ... examples/train_ddp.py --fsdp2 ...                     # shard with fully_shard (FSDP2) instead of DDP

``--fsdp2``: every Linear layer and the whole model are ``fully_shard``ed over a CPU device mesh of all ranks;
the checkpoint is sharded DCP (each rank writes its shards), and a resume on another number of ranks reshards on
load (DCP), with the RNG streams starting afresh (a warning says so). Own time per step comes from
``client.watch_collectives()`` (FSDP2's all-gathers and reduce-scatters) instead of ``client.watch_ddp``.

Its process group is ``init_process_group("gloo", init_method="env://")``: under the supervisor (any launch
style, docs/launch.md) and torchrun the variables are set; under plain srun it derives them itself.

``--restartable``: ``main`` runs inside ``client.restartable``: when a peer dies, the rank restarts it in its own
process on the supervisor's order (a warm restart, docs/launch.md), resuming from the memory snapshot or checkpoint
the order names, instead of ending.

``--timings``: rank 0 also prints, after its first step, one line on stderr with the wall-clock times (epoch
seconds) of its start-up stages: ``timings: exec=T python=T torch=T pg=T restored=T step=T`` (the process's exec
as the kernel recorded it, the interpreter reaching this file, torch imported, the process group built, the
checkpoint restored, the first step done). The node-loss bench reads it (bench/bench_recovery.py).

Rank 0 prints exactly one ``step=N loss=X`` line per step (X is ``repr(float)``). A run resumes from
``SUPERVISOR_RESUME_FROM`` when set (empty = fresh start), else from the newest valid checkpoint in
``--ckpt-dir``, and then prints bitwise the same lines as an uninterrupted run: the data order (sampler
epoch/offset), the model, the optimizer and every RNG (torch, python ``random``) come from the checkpoint.

The memory tier: at the end of every step ``saver.snapshot`` copies the same state into node memory at the
supervisor's cadence (a no-op unsupervised), and at start ``saver.restore_snapshot`` resumes from the snapshot
the supervisor picked (``SUPERVISOR_RESUME_MEMORY_STEP``) before any filesystem checkpoint is looked for;
rank 0 then prints ``resumed from memory at step N``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import math
import os
import random
import signal
import socket
import sys
import time
import zlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import NoReturn

_T_IMPORT = time.time()  # the interpreter reached this file, torch not imported yet (the --timings line)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict  # noqa: E402

_T_TORCH = time.time()

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from supervisor.checkpoint.commit import CheckpointSaver, load, read_manifest, resume_path  # noqa: E402


class _Unsupervised:
    """Stand-in used only when ``supervisor.client`` is not importable: the real one is a no-op unsupervised."""

    def step(self, i: int, loss: float | None = None) -> None:
        pass

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        yield

    def should_checkpoint(self) -> bool:
        return False

    def should_stop(self) -> bool:
        return False

    def skip_steps(self) -> range:
        return range(0)


def _client() -> object:
    try:
        from supervisor import client

        for name in ("step", "phase", "should_checkpoint", "should_stop"):
            getattr(client, name)
        return client
    except (ImportError, AttributeError):
        return _Unsupervised()


client = _client()
_signalled = {"stop": False}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, required=True, help="train until this many steps are done")
    p.add_argument("--ckpt-dir", required=True, help="checkpoint root (created if missing)")
    p.add_argument("--ckpt-every", type=int, default=10, help="checkpoint every K steps (0: only at the end)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-time", type=float, default=0.0, help="sleep S seconds per step (simulate slow steps)")
    p.add_argument("--model-mb", type=float, default=1.0, help="approximate model size in MiB (float32)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--dataset-size", type=int, default=1024)
    p.add_argument("--async-save", action="store_true", help="block only while staging, write in background")
    p.add_argument("--keep-last", type=int, default=3)
    p.add_argument("--keep-every", type=int, default=0, help="also keep every checkpoint whose step divides by N")
    p.add_argument("--fsdp2", action="store_true", help="shard the model with fully_shard (FSDP2) instead of DDP")
    p.add_argument("--timings", action="store_true", help="rank 0: print the start-up stages' times (stderr)")
    p.add_argument("--checksums", action="store_true",
                   help="(tests) rank 0 prints the full weights' checksum at each save and after a restore (stderr)")
    p.add_argument("--die-at-step", type=int, default=0, help="(tests) SIGKILL every rank right after step N")
    p.add_argument("--hang-at-step", type=int, default=0,
                   help="(tests) rank 1 hangs alive (sleeps, outside any collective) right after step N, once per "
                        "campaign (a marker in the checkpoint directory): a live hang; its peers wait in the next "
                        "collective")  # fmt: skip
    p.add_argument("--nan-at-step", type=int, default=0,
                   help="(tests) the batch of step N is poisoned: its loss is NaN, the weights become NaN, and so "
                        "is every later loss (a diverged run), unless that batch is skipped after a roll back")
    p.add_argument("--diverge-at-step", type=int, default=0,
                   help="(tests) the batch of step N throws the weights off: the loss jumps and stays high (a spike "
                        "it does not come back from), unless that batch is skipped after a roll back")
    p.add_argument("--ignore-requests", action="store_true",
                   help="(tests) never act on the supervisor's checkpoint/stop requests, as a script that does not "
                        "ask for them (client.should_checkpoint) would: SIGTERM ends it at once, unsaved, and "
                        "SIGUSR1 is ignored")  # fmt: skip
    p.add_argument("--restartable", action="store_true",
                   help="train inside client.restartable: when a peer dies, this rank restarts main() in its own "
                        "process on the supervisor's order (warm restart, docs/launch.md) instead of ending")
    args = p.parse_args(argv)
    if args.steps < 0 or args.ckpt_every < 0 or args.batch_size < 1 or args.model_mb <= 0:
        p.error("--steps/--ckpt-every must be >= 0, --batch-size >= 1, --model-mb > 0")
    return args


# -- process group ---------------------------------------------------------------------------------------
def _first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist (``node[03-05,7],gpu1`` -> ``node03``) without calling scontrol."""
    depth, end = 0, len(nodelist)
    for i, ch in enumerate(nodelist):
        depth += {"[": 1, "]": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            end = i
            break
    head = nodelist[:end]
    if "[" not in head:
        return head
    prefix, ranges = head.split("[", 1)
    return prefix + ranges.rstrip("]").split(",")[0].split("-")[0]


def _fallback_port() -> int:
    """Plain srun without the supervisor: a port every task of this step computes alike. Mixes the cluster
    (its name and config path: test clusters on one host share job ids), the job and the step, so clusters and
    relaunches differ; below the ephemeral range."""
    key = ":".join(os.environ.get(k, "") for k in ("SLURM_CLUSTER_NAME", "SLURM_CONF", "SLURM_JOB_ID",
                                                    "SLURM_STEP_ID", "SLURM_RESTART_COUNT"))
    return 15000 + zlib.crc32(key.encode()) % 17000


def init_distributed() -> tuple[int, int]:
    """rank, world; ``init_process_group`` with ``env://``. The supervisor (and torchrun) export MASTER_ADDR,
    MASTER_PORT, RANK and WORLD_SIZE; under plain srun without the supervisor they are derived here from srun's
    variables (first node of the step, a port of this step); otherwise a single process."""
    env = os.environ
    if not ("RANK" in env and "WORLD_SIZE" in env):
        if not ("SLURM_STEP_ID" in env and "SLURM_PROCID" in env):
            return 0, 1
        env["RANK"] = env["SLURM_PROCID"]
        env["WORLD_SIZE"] = env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS") or "1"
    if int(env["WORLD_SIZE"]) > 1 and not env.get("MASTER_ADDR"):
        addr = _first_host(env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""))
        try:
            addr = socket.gethostbyname(addr)
        except OSError:
            addr = "127.0.0.1"  # node names that are not DNS names (a one-host test cluster)
        env["MASTER_ADDR"] = addr
    env.setdefault("MASTER_PORT", str(_fallback_port()))
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    if world > 1:
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                                timeout=timedelta(seconds=300))
    return rank, world


# -- model and data ----------------------------------------------------------------------------------------
IN_FEATURES = 32


def build_model(model_mb: float) -> nn.Module:
    hidden = max(8, int(math.sqrt(model_mb * (1 << 20) / 4)))
    return nn.Sequential(nn.Linear(IN_FEATURES, hidden), nn.ReLU(), nn.Dropout(0.1),
                         nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))


def make_dataset(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, IN_FEATURES, generator=gen)
    y = torch.sin(x.sum(dim=1, keepdim=True)) + 0.1 * torch.randn(n, 1, generator=gen)
    return x, y


def batch_indices(epoch: int, offset: int, *, n: int, batch: int, rank: int, world: int, seed: int) -> torch.Tensor:
    """Indices of this rank's batch number ``offset`` in ``epoch``: a seeded permutation, split by rank."""
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100_003 + epoch))
    mine = perm[rank::world]
    return mine[offset * batch:(offset + 1) * batch]


def shard_fsdp2(net: nn.Module, world: int) -> nn.Module:
    """FSDP2: each Linear layer, then the whole model, sharded over a CPU mesh of every rank (gloo)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():  # one process: a group of one, so the state dict is sharded DCP all the same
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_fallback_port()}", rank=0, world_size=1)
    mesh = init_device_mesh("cpu", (world,))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    if hasattr(client, "watch_collectives"):
        client.watch_collectives()  # own time per step: FSDP2's collective waits left out
    return net


# -- checkpoint state --------------------------------------------------------------------------------------
def _python_rng_tensor() -> torch.Tensor:
    version, internal, gauss = random.getstate()
    return torch.tensor([version, *internal, -1 if gauss is None else 1], dtype=torch.int64)


def _set_python_rng(t: torch.Tensor, gauss: torch.Tensor) -> None:
    values = t.tolist()
    random.setstate((values[0], tuple(values[1:-1]), None if values[-1] < 0 else float(gauss.item())))


def checkpoint_state(model: nn.Module, opt: torch.optim.Optimizer, rank: int, step: int, epoch: int,
                     offset: int) -> dict:
    model_sd, optim_sd = get_state_dict(model, opt)
    gauss = random.getstate()[2]
    return {
        "model": model_sd,
        "optim": optim_sd,
        "train": {"step": torch.tensor(step), "epoch": torch.tensor(epoch), "offset": torch.tensor(offset)},
        f"rng_rank{rank}": {"torch": torch.get_rng_state(), "python": _python_rng_tensor(),
                            "python_gauss": torch.tensor(0.0 if gauss is None else gauss, dtype=torch.float64)},
    }


def restore(path: Path, model: nn.Module, opt: torch.optim.Optimizer, rank: int, world: int) -> tuple[int, int, int]:
    state = checkpoint_state(model, opt, rank, 0, 0, 0)
    saved_world = read_manifest(path).world_size
    same_world = saved_world == world
    if not same_world:  # this rank's RNG streams are not in the checkpoint
        del state[f"rng_rank{rank}"]
    load(path, state)
    if not same_world:
        print(f"warning: checkpoint world size {saved_world} != {world}: RNG streams restart",
              file=sys.stderr)
    return apply_state(state, model, opt, rank)


def apply_state(state: dict, model: nn.Module, opt: torch.optim.Optimizer, rank: int) -> tuple[int, int, int]:
    """Put a loaded state into the model, the optimizer and this rank's RNG streams (when it holds them)."""
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng = state.get(f"rng_rank{rank}")
    if rng is not None:
        torch.set_rng_state(rng["torch"])
        _set_python_rng(rng["python"], rng["python_gauss"])
    train = state["train"]
    return int(train["step"]), int(train["epoch"]), int(train["offset"])


# -- loop --------------------------------------------------------------------------------------------------
def weights_checksum(model: nn.Module) -> str:
    """The full (unsharded) weights, hashed: every rank must call it (a sharded parameter is gathered)."""
    import hashlib

    digest = hashlib.sha256()
    for p in model.parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        digest.update(full.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def agree(flags: list[bool], world: int) -> list[bool]:
    """Every rank must take the same checkpoint/stop decision, or the collectives deadlock."""
    if world == 1:
        return flags
    t = torch.tensor([int(f) for f in flags], dtype=torch.int32)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def _exec_time() -> float | None:
    """When the kernel started this process (Linux /proc: its start in clock ticks after boot, against the
    uptime now; /proc/stat's btime is whole seconds), in epoch seconds; None elsewhere."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


def print_timings(marks: dict[str, float]) -> None:
    stages = {"exec": _exec_time(), "python": _T_IMPORT, "torch": _T_TORCH, **marks}
    line = " ".join(f"{k}={v:.3f}" for k, v in stages.items() if v is not None)
    print(f"timings: {line}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if args.ignore_requests:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # SIGTERM keeps its default: the process ends, unsaved
    else:
        for sig in (signal.SIGTERM, signal.SIGUSR1):
            signal.signal(sig, lambda *_: _signalled.__setitem__("stop", True))
    rank, world = init_distributed()
    marks = {"pg": time.time()}
    torch.manual_seed(args.seed * 1000 + rank)
    random.seed(args.seed * 1000 + rank)
    with client.phase("init"):  # type: ignore[attr-defined]
        x, y = make_dataset(args.dataset_size, args.seed)
        steps_per_epoch = (args.dataset_size // world) // args.batch_size
        if steps_per_epoch < 1:
            raise SystemExit("error: --dataset-size too small for --batch-size x world size")
        net = build_model(args.model_mb)
        if args.fsdp2:
            model = shard_fsdp2(net, world)
        else:
            model = nn.parallel.DistributedDataParallel(net) if world > 1 else net
            if world > 1 and hasattr(client, "watch_ddp"):
                client.watch_ddp(model)  # own time per step (the all-reduce's wait left out): names a straggler
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        saver = CheckpointSaver(args.ckpt_dir, keep_last=args.keep_last, keep_every=args.keep_every,
                                seeds={"seed": args.seed})
        start, epoch, offset = 0, 0, 0
        with client.phase("restore"):  # type: ignore[attr-defined]
            # The memory tier first: the supervisor names a snapshot in node memory when one is newer than the
            # newest checkpoint; every rank's copy is checked before any is used.
            snap = checkpoint_state(model, opt, rank, 0, 0, 0)
            resume = "memory" if saver.restore_snapshot(snap) is not None else resume_path(args.ckpt_dir)
            if resume == "memory":
                start, epoch, offset = apply_state(snap, model, opt, rank)
            elif resume is not None:
                start, epoch, offset = restore(resume, model, opt, rank, world)
        if resume is not None:
            if rank == 0:
                print(f"resumed from {resume} at step {start}", file=sys.stderr, flush=True)
            if args.checksums:
                checksum = weights_checksum(model)
                if rank == 0:
                    print(f"restored checksum={checksum}", file=sys.stderr, flush=True)
    marks["restored"] = time.time()
    loss_fn = nn.MSELoss()
    stop = False
    skip = client.skip_steps()  # type: ignore[attr-defined]  # after a roll back: batches not to train on
    for step in range(start + 1, args.steps + 1):
        idx = batch_indices(epoch, offset, n=args.dataset_size, batch=args.batch_size, rank=rank, world=world,
                            seed=args.seed)
        offset += 1
        if offset == steps_per_epoch:
            epoch, offset = epoch + 1, 0
        target = y[idx] + 0.001 * random.random()
        if step in skip:  # after a roll back: a batch seen before the loss diverged (one of them did it)
            client.step(step)  # type: ignore[attr-defined]
            if rank == 0:  # (stderr: stdout's step lines stay `step=N loss=X`)
                print(f"skipped the batch of step {step} (roll back)", file=sys.stderr, flush=True)
        else:
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x[idx]), target)
            if step == args.nan_at_step:
                loss = loss * float("nan")
            loss.backward()
            opt.step()
            if step == args.diverge_at_step:
                with torch.no_grad():
                    for weight in model.parameters():
                        weight.add_(3.0)
            value = float(loss.item())
            client.step(step, loss=value)  # type: ignore[attr-defined]
            if rank == 0:
                if args.timings and step == start + 1:  # before the step's line: whoever sees that line finds it
                    print_timings({**marks, "step": time.time()})
                print(f"step={step} loss={value!r}", flush=True)
        if args.step_time:
            time.sleep(args.step_time)
        asked = [client.should_checkpoint(), client.should_stop()] if not args.ignore_requests else [False, False]  # type: ignore[attr-defined]
        want_ckpt, stop = agree([asked[0], asked[1] or _signalled["stop"]], world)
        periodic = args.ckpt_every > 0 and step % args.ckpt_every == 0
        if periodic or want_ckpt or stop or step == args.steps:
            with client.phase("checkpoint"):  # type: ignore[attr-defined]
                saver.save(checkpoint_state(model, opt, rank, step, epoch, offset), step,
                           extra={"epoch": epoch, "offset": offset, "seed": args.seed}, async_save=args.async_save)
                if args.checksums:
                    checksum = weights_checksum(model)
                    if rank == 0:
                        print(f"saved step {step} checksum={checksum}", file=sys.stderr, flush=True)
        # node memory, at the supervisor's cadence (a no-op unsupervised): a fault loses a step or two
        saver.snapshot(lambda: checkpoint_state(model, opt, rank, step, epoch, offset), step)  # noqa: B023
        if args.die_at_step and step == args.die_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if args.hang_at_step and step == args.hang_at_step and rank == 1:
            hang_once(Path(args.ckpt_dir) / ".hung-once", step)
        if stop:
            break
    saver.close()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    return 143 if stop and _signalled["stop"] else 0


def hang_once(marker: Path, step: int) -> None:
    """(--hang-at-step) Sleep forever, alive, the first time a process of this campaign gets here (the marker says
    it happened): a restarted rank 1 trains on. Says when on stderr (wall time: a bench's clock)."""
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    os.close(fd)
    print(f"rank 1 hangs after step {step} at {time.time():.3f}", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)


def leave(code: int) -> NoReturn:
    """Exit without the interpreter's finalization, after running the exit handlers (the supervisor's client
    marks a normal exit there). WHY: torch's gloo worker threads drop a finished collective's tensors a moment
    after the collective returns; when that moment falls into the interpreter's finalization (a busy machine
    stretches it) the thread cannot take the GIL, and the process aborts with "terminate called without an active
    exception" after training completed (pytorch/pytorch#179291; seen here with FSDP2 on a loaded 2-core host,
    about one process in 25)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    warm = "--restartable" in sys.argv[1:] and hasattr(client, "restartable")
    leave((client.restartable(main) if warm else main)())  # type: ignore[attr-defined]

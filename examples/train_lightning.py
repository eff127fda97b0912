"""A small PyTorch Lightning training program (CPU, DDP over gloo) supervised with examples/lightning_callback.py.

    supervise submit -N 2 --ntasks-per-node=1 -- python examples/train_lightning.py --steps 60 --ckpt-dir /tmp/ck

It saves ``step-NNNNNNNN.ckpt`` every ``--ckpt-every`` steps (Lightning's ModelCheckpoint) and resumes from the
checkpoint the supervisor validated (``SUPERVISOR_RESUME_FROM``), else the newest usable ``.ckpt`` in
``--ckpt-dir`` (``resume_from``). Rank 0 prints ``step=N loss=X`` per step and ``resumed from PATH at step N``
after a resume. Under Slurm, Lightning's own SLURM environment is used with its auto-requeue off
(``cluster_plugins``): the supervisor owns requeue. Needs the ``lightning`` extra (``pip install
'slurm-supervisor[lightning]'``).

``--restartable``: each attempt (a new Trainer, resuming from the checkpoint the supervisor names) runs inside
``client.restartable``, so when a peer dies this rank restarts in its own process on the supervisor's order
(docs/launch.md, "Warm restart"). Lightning's SLURMEnvironment takes the rank from ``SLURM_PROCID`` and the world
from ``SLURM_NTASKS``: a rank started again as its own job step gets its place in the launch there too.
"""

from __future__ import annotations

import argparse
import atexit
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
from examples.lightning_callback import SupervisorCallback, cluster_plugins, pl, resume_from  # noqa: E402


class Regression(pl.LightningModule):
    def __init__(self, step_time: float = 0.0) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.step_time = step_time

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        if self.global_rank == 0:
            print(f"step={self.global_step + 1} loss={loss.detach().item()!r}", flush=True)
        if self.step_time:
            time.sleep(self.step_time)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def data(seed: int, n: int = 4096) -> DataLoader:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=gen)
    y = torch.sin(x.sum(dim=1, keepdim=True))
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=gen)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--ckpt-dir", required=True)
    p.add_argument("--ckpt-every", type=int, default=10)
    p.add_argument("--step-time", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--restartable", action="store_true", help="train inside client.restartable (warm restart)")
    args = p.parse_args(argv)
    if args.restartable:
        from supervisor import client

        client.restartable(fit)(args)
    else:
        fit(args)
    return 0


def fit(args: argparse.Namespace) -> None:
    """One attempt: a new Trainer, from the newest checkpoint (the supervisor's word, else the directory's)."""
    pl.seed_everything(args.seed, verbose=False)
    ckpt_dir = Path(args.ckpt_dir)
    resume = resume_from(ckpt_dir)  # every rank, before anything is written
    nodes = int(os.environ.get("SLURM_STEP_NUM_NODES") or os.environ.get("SLURM_NNODES") or 1)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("SLURM_NTASKS_PER_NODE") or 1)
    world = nodes * devices
    trainer = pl.Trainer(
        accelerator="cpu", devices=devices, num_nodes=nodes, max_steps=args.steps,
        strategy=pl.strategies.DDPStrategy(process_group_backend="gloo") if world > 1 else "auto",
        plugins=cluster_plugins(), logger=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=str(ckpt_dir), use_distributed_sampler=True,
        callbacks=[
            SupervisorCallback(ckpt_dir=ckpt_dir, check_every=1),
            pl.callbacks.ModelCheckpoint(dirpath=ckpt_dir, filename="step-{step:08d}", auto_insert_metric_name=False,
                                         every_n_train_steps=args.ckpt_every, save_top_k=-1),
        ],
    )  # fmt: skip
    if resume and trainer.global_rank == 0:
        print(f"resumed from {resume}", file=sys.stderr, flush=True)
    trainer.fit(Regression(args.step_time), train_dataloaders=data(args.seed), ckpt_path=resume)


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's finalization, after the exit handlers (the client marks a normal exit there):
    # gloo's threads can abort a finished process there under load, "terminate called without an active exception"
    # (pytorch/pytorch#179291; examples/train_ddp.py's leave). Seen here: a rank restarted warm in a standby
    # aborted after step 40 of 40, and the completed training was relaunched as an app error.
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

"""Supervise a PyTorch Lightning training run: heartbeats, phases, checkpoint/stop requests, resume.

Lightning is not a dependency of slurm-supervisor; only this example imports it (``lightning`` or
the older ``pytorch_lightning``). Usage::

    from examples.lightning_callback import SupervisorCallback, resume_from

    trainer = pl.Trainer(callbacks=[SupervisorCallback(ckpt_dir="ckpt")], ...)
    trainer.fit(model, datamodule=dm, ckpt_path=resume_from("ckpt"))  # None: fresh start

``resume_from`` returns the checkpoint the supervisor validated (``SUPERVISOR_RESUME_FROM``), "fresh start"
when it says so (empty), and otherwise (unsupervised, or a supervisor that does not know the directory)
the newest usable ``*.ckpt`` in ``ckpt_dir`` as the supervisor's store judges it: torn files are skipped,
and nothing is unpickled to decide.

Run unsupervised, every client call is a no-op and the callback changes nothing.

Why a collective every ``check_every`` steps: ranks read their own slots and may see a request (or
SIGTERM) one step apart; a checkpoint or stop must happen on all ranks at the same step, so the
callback agrees on it with one tiny all-reduce (``reduce_boolean_decision``). Requests published
with ``at_step`` already agree, but SIGTERM does not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from supervisor import client
from supervisor.checkpoint.store import CheckpointStore

try:
    import lightning.pytorch as pl
except ImportError:  # pragma: no cover - depends on which Lightning is installed
    import pytorch_lightning as pl  # type: ignore[no-redef]


class SupervisorCallback(pl.Callback):
    """Report each training step to the supervisor and act on its requests.

    ckpt_dir: where requested checkpoints go (``step-00000123.ckpt``).
    check_every: steps between agreement rounds on checkpoint/stop (one all-reduce each).
    loss_every: pass the loss every N steps (0: never). Reading a CUDA loss waits for the GPU;
        use the interval at which you already log the loss, or 0.
    """

    def __init__(self, ckpt_dir: str | Path, check_every: int = 10, loss_every: int = 1) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        client.saves_to(self.ckpt_dir)  # resume works behind a wrapper script too (no --ckpt-dir in the command)
        self.check_every = max(1, check_every)
        self.loss_every = loss_every
        self._eval_phase: Any = None

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        loss = None
        if self.loss_every and step % self.loss_every == 0:
            loss = _loss_value(outputs)
        client.step(step, loss=loss)
        if step % self.check_every:
            return
        strategy = trainer.strategy
        stop = strategy.reduce_boolean_decision(client.should_stop(), all=False)
        checkpoint = stop or strategy.reduce_boolean_decision(client.should_checkpoint(), all=False)
        if checkpoint:
            self.ckpt_dir.mkdir(parents=True, exist_ok=True)
            with client.phase("checkpoint"):  # a completed block acknowledges the request
                trainer.save_checkpoint(str(self.ckpt_dir / f"step-{step:08d}.ckpt"))
        if stop:
            trainer.should_stop = True

    def on_validation_start(self, trainer: Any, pl_module: Any) -> None:
        self._eval_phase = client.phase("eval")

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        if self._eval_phase is not None:
            self._eval_phase.__exit__(None, None, None)
            self._eval_phase = None


def cluster_plugins() -> list[Any]:
    """``Trainer(plugins=cluster_plugins())``: inside a Slurm step, Lightning's SLURM environment with its
    auto-requeue **off**. Under the supervisor, requeue belongs to the supervisor (it checkpoints through the
    client, classifies the interruption, excludes blamed nodes and requeues itself); Lightning's own handler
    would, on SIGUSR1, save an ``hpc_ckpt`` and run ``scontrol requeue`` behind its back. Outside Slurm: none
    (Lightning picks its environment itself). The rank layout still comes from srun (``SLURM_PROCID``...), and
    MASTER_ADDR/MASTER_PORT from the supervisor's launch (docs/launch.md)."""
    if "SLURM_STEP_ID" not in os.environ and "SLURM_JOB_ID" not in os.environ:
        return []
    import importlib

    environments = importlib.import_module(f"{pl.__name__}.plugins.environments")  # either Lightning package
    return [environments.SLURMEnvironment(auto_requeue=False)]


def resume_from(ckpt_dir: str | Path) -> str | None:
    """The checkpoint file to pass as ``trainer.fit(ckpt_path=...)``, or None for a fresh start.

    Every rank calls it before any checkpoint is written, so they all see the same directory content.
    """
    if "SUPERVISOR_RESUME_FROM" in os.environ:  # the supervisor decided ("" = it knows there is nothing)
        return client.resume_from()
    root = Path(ckpt_dir)
    if not root.is_dir():
        return None
    info = CheckpointStore(root).newest_valid(full=False, quarantine=False)
    return str(info.path) if info is not None and info.path.is_file() else None


def _loss_value(outputs: Any) -> float | None:
    """The step's loss as a float (this is where a CUDA tensor would sync)."""
    loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if loss is None:
        return None
    try:
        value = float(loss.detach()) if hasattr(loss, "detach") else float(loss)
    except (TypeError, ValueError):
        return None
    return value  # NaN/Inf kept: the supervisor's loss detector wants to see them

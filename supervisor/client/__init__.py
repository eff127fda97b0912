"""Training-side client: ``from supervisor import client``.

    client.step(i, loss=loss_value)        # end of iteration i: the heartbeat (no syscall)
    with client.phase("checkpoint"): ...   # phases: init step checkpoint eval restore data other
    client.should_checkpoint(), client.should_stop(), client.resume_from()
    client.skip_steps()                    # after a NaN roll back: the steps whose batches to skip
    client.saves_to(ckpt_dir)              # where checkpoints go, when the command's flags do not say (wrappers)
    client.watch_ddp(ddp_model)            # once: own time per step (collective waits excluded), for stragglers
    client.watch_collectives()             # the same for FSDP2 / any torch.distributed collectives
    client.restartable(train)              # a peer's failure restarts train() in this process (warm restart)

A silent no-op when no supervisor runs the program. Imports only the standard library.
See docs/client.md.
"""

from supervisor.client.api import (
    defer_sigterm,
    is_supervised,
    phase,
    resume_from,
    should_checkpoint,
    should_stop,
    step,
)
from supervisor.client.collectives import unwatch_collectives, waiting, watch_collectives, watch_ddp
from supervisor.client.declare import saves_to
from supervisor.client.restart import generation, restartable
from supervisor.client.rollback import skip_steps

__all__ = [
    "defer_sigterm",
    "generation",
    "is_supervised",
    "phase",
    "restartable",
    "resume_from",
    "saves_to",
    "should_checkpoint",
    "should_stop",
    "skip_steps",
    "step",
    "unwatch_collectives",
    "waiting",
    "watch_collectives",
    "watch_ddp",
]

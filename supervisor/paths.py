"""Every file name of a campaign directory and of the node-local slot directory, in one place.

The campaign directory (contract, see docs/architecture.md) is private (0700: it holds the channel secret):
``campaign.json`` (what to run, written once at submit), ``batch.sh``, ``journal.jsonl``, ``secret`` (0600,
authenticates the heartbeat channel), ``aggregator.json`` (0600: where this Slurm run's aggregator listens and
its channel nonce), ``live.json`` (the live table), ``logs/`` (one folder per Slurm run), ``stacks/``.

The slot directory is node-local shared memory where ranks publish heartbeats for the node agent.

WHY stdlib-only and no imports from the package: the training-side client imports this module inside every
rank, so it must stay cheap (no dataclasses/inspect, nothing from the supervisor side).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

SPEC_NAME = "campaign.json"
BATCH_NAME = "batch.sh"
JOURNAL_NAME = "journal.jsonl"
SECRET_NAME = "secret"
ADDRESS_NAME = "aggregator.json"
LIVE_NAME = "live.json"
LOGS_NAME = "logs"
STACKS_NAME = "stacks"
DECLARED_CHECKPOINT_DIR_NAME = "checkpoint_dir.declared"  # where the program said it saves (client.saves_to)

SLOT_DIR_ENV = "SUPERVISOR_SLOT_DIR"  # the slot directory template ranks and agents get ({node} filled in)
SLOT_ROOT = "/dev/shm"
SLOT_PREFIX = "supervisor-"


class CampaignPaths(NamedTuple):
    """The files of one campaign directory."""

    root: Path

    @property
    def spec(self) -> Path:
        return self.root / SPEC_NAME

    @property
    def batch_script(self) -> Path:
        return self.root / BATCH_NAME

    @property
    def journal(self) -> Path:
        return self.root / JOURNAL_NAME

    @property
    def secret(self) -> Path:
        return self.root / SECRET_NAME

    @property
    def address(self) -> Path:
        return self.root / ADDRESS_NAME

    @property
    def logs(self) -> Path:
        return self.root / LOGS_NAME

    @property
    def live(self) -> Path:
        return self.root / LIVE_NAME

    @property
    def stacks(self) -> Path:
        return self.root / STACKS_NAME

    @property
    def declared_checkpoint_dir(self) -> Path:
        return self.root / DECLARED_CHECKPOINT_DIR_NAME

    def batch_log(self, job_id: str) -> Path:
        """The batch step's output, every Slurm run of the job appended (``--output=.../batch-%j.out``)."""
        return self.logs / f"batch-{job_id}.out"

    def attempt_logs(self, job_id: str, restart: int) -> Path:
        """The logs of one Slurm run of the campaign (job id + Slurm's restart count)."""
        return self.logs / f"job{job_id}-restart{restart}"


def slot_dir_template(job_id: str, token: str = "", uid: int | None = None) -> str:
    """``SUPERVISOR_SLOT_DIR`` for ranks and agents: node-local shared memory, private to the job and user.

    ``token``: a fresh random value per Slurm run, so another local user cannot create (squat) the directory
    before the agent does: the name is unguessable until the agent has made it.  ``{node}`` is filled in by the
    client and the agent with the Slurm node name, so several slurmd on one host (the local test cluster) never
    share a slot directory."""
    user = os.getuid() if uid is None else uid
    middle = f"{job_id}-{user}-{token}" if token else f"{job_id}-{user}"
    return f"{SLOT_ROOT}/{SLOT_PREFIX}{middle}-{{node}}"


def default_slot_dir(job_id: str, uid: int | None = None) -> Path:
    """A standalone agent's slot directory when no template is given: ``/dev/shm/supervisor-<jobid>-<uid>``."""
    return Path(SLOT_ROOT) / f"{SLOT_PREFIX}{job_id}-{os.getuid() if uid is None else uid}"


def expand_slot_dir(template: str, *, job: str, node: str) -> Path:
    """Replace ``{node}``, ``{job}`` and ``{uid}`` in a slot-dir setting: one srun command line serves every
    node, and several slurmd sharing one host (the local test cluster) need one slot dir per node."""
    return Path(template.replace("{node}", node).replace("{job}", job).replace("{uid}", str(os.getuid())))

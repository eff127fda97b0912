"""slurm-supervisor: a Slurm-integrated supervisor for long distributed training campaigns.

Keep this module import-light: ``from supervisor import client`` runs inside every training rank,
so nothing heavy (structlog, psutil, the Slurm adapter, torch) may be imported here.
"""

__version__ = "0.1.0"

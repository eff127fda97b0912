"""Slurm adapter: hostlists, the job environment, and a typed client over the Slurm CLI (or pyslurm)."""

"""The local cluster's one error type, in a module of its own so that the package's parts (``procs.py``, ``chroot.py``) can
raise it without importing the package that imports them. ``slurm.localcluster`` re-exports it."""


class ClusterError(RuntimeError):
    """The local cluster cannot be started or controlled; the message names the problem and the fix."""

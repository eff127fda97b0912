"""The per-job secret that authenticates agent <-> supervisor frames.

Why a file in the campaign dir: the batch host and every node see the campaign dir (shared filesystem),
only the job's user can read it (dir 0700, file 0600), and nothing secret travels on a command line
(``ps`` shows those to everyone) or in the environment (``/proc/PID/environ`` of a rank leaks more easily).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from supervisor import paths
from supervisor.errors import CampaignError, ConfigError

SECRET_NAME = paths.SECRET_NAME
SECRET_BYTES = 32


def ensure_private_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents) if missing and make it 0700."""
    p = Path(path)
    p.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(p, 0o700)
    return p


def create_secret(campaign_dir: str | os.PathLike[str]) -> bytes:
    """Return the campaign's secret, creating it (32 random bytes, hex, mode 0600) if it does not exist yet.

    Keeps an existing secret: agents of a still-running attempt must keep authenticating after a restart.
    """
    directory = ensure_private_dir(campaign_dir)
    path = directory / SECRET_NAME
    value = secrets.token_hex(SECRET_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        return load_secret(path)
    with os.fdopen(fd, "w") as fh:
        fh.write(value + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    return bytes.fromhex(value)


def load_secret(path: str | os.PathLike[str]) -> bytes:
    """Read a secret file; refuse one that others can read, or that is not 64 hex digits."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise CampaignError(f"secret file {p} does not exist",
                            "pass the campaign directory the supervisor created (it writes `secret` there)") from None
    except OSError as err:
        raise CampaignError(f"cannot open secret file {p}: {err.strerror}",
                            "check the campaign directory's owner and permissions") from None
    with os.fdopen(fd, "r") as fh:
        mode = os.fstat(fh.fileno()).st_mode
        if not stat.S_ISREG(mode) or mode & 0o077:
            raise ConfigError(f"secret file {p} is readable by others (mode {stat.S_IMODE(mode):o})",
                              f"run `chmod 600 {p}`")
        text = fh.read(4 * SECRET_BYTES).strip()
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        raw = b""
    if len(raw) != SECRET_BYTES:
        raise ConfigError(f"secret file {p} does not hold {2 * SECRET_BYTES} hex digits",
                          "delete it and let the supervisor create a new one")
    return raw

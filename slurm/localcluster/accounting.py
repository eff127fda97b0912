"""Optional accounting (``up --accounting``): a private MariaDB and slurmdbd, so that ``sacct`` works.

Why optional: it costs two more packages (~20 s to install), ~100 MB of memory and a few seconds at start, and most
tests only need squeue/scontrol. The database lives under ROOT/db, listens on 127.0.0.1 only, and its password is
random and kept only in ROOT/etc/slurmdbd.conf (0600, as slurmdbd demands); SQL goes over stdin, never argv.
"""

from __future__ import annotations

import re
import secrets
import subprocess
import time
from pathlib import Path

from slurm.localcluster.config import ClusterSpec, render_slurmdbd_conf


def db_dir(spec: ClusterSpec) -> Path:
    return spec.layout.root / "db"


def db_socket(spec: ClusterSpec) -> Path:
    return spec.layout.run / "mariadb.sock"


def dbd_conf(spec: ClusterSpec) -> Path:
    return spec.layout.etc / "slurmdbd.conf"


def mariadbd_argv(spec: ClusterSpec) -> list[str]:
    """mariadbd runs in the foreground; the caller detaches it. --no-defaults: ignore the system's my.cnf."""
    lay = spec.layout
    return [
        "--no-defaults",
        f"--datadir={db_dir(spec)}",
        f"--socket={db_socket(spec)}",
        f"--port={spec.db_port}",
        "--bind-address=127.0.0.1",
        f"--pid-file={lay.pid_file('mariadbd')}",
        f"--log-error={lay.log_file('mariadbd')}",
        f"--user={spec.user}",
        "--innodb-buffer-pool-size=32M",
        "--innodb-lock-wait-timeout=900",
        "--skip-name-resolve",
    ]


def stored_password(spec: ClusterSpec) -> str | None:
    try:
        text = dbd_conf(spec).read_text()
    except FileNotFoundError:
        return None
    m = re.search(r"^StoragePass=(\S+)$", text, re.M)
    return m.group(1) if m else None


def dbd_conf_text(spec: ClusterSpec) -> str:
    """slurmdbd.conf, keeping the password already set up in the database (a new one is made only once)."""
    return render_slurmdbd_conf(spec, stored_password(spec) or secrets.token_hex(16))


def initialise_db(spec: ClusterSpec, install_db: Path) -> None:
    """Create the MariaDB data directory the first time (root may log in only through the private socket)."""
    data = db_dir(spec)
    if (data / "mysql").is_dir():
        return
    data.mkdir(mode=0o700, exist_ok=True)
    res = subprocess.run(
        [str(install_db), "--no-defaults", f"--datadir={data}", f"--user={spec.user}",
         "--auth-root-authentication-method=socket", "--skip-test-db"],
        capture_output=True, text=True, timeout=120,
    )
    if res.returncode != 0:
        raise RuntimeError(f"mariadb-install-db failed: {(res.stderr or res.stdout).strip()[-500:]}")


def grant_slurm_user(spec: ClusterSpec, client: Path, timeout: float) -> None:
    """Wait for the database to answer, then (idempotently) create the ``slurm`` user with the stored password."""
    password = stored_password(spec)
    if password is None:
        raise RuntimeError(f"{dbd_conf(spec)} has no StoragePass")
    sql = (
        f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
        f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}';\n"
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';\n"
        "FLUSH PRIVILEGES;\n"
    )
    argv = [str(client), "--no-defaults", f"--socket={db_socket(spec)}", "-u", "root"]
    deadline = time.monotonic() + timeout
    while True:
        res = subprocess.run(argv, input=sql, capture_output=True, text=True, timeout=30)
        if res.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"cannot set up the slurm database user: {res.stderr.strip()}")
        time.sleep(0.2)

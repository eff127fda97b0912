"""Install the Debian Slurm packages when they are missing (fresh Debian 12/13 machine, as root).

Why here: tests and the demo must be able to start their own cluster on a bare machine; installing is skipped
entirely when the programs are already present, so a normal run never touches apt.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

BASE_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
ACCOUNTING_PACKAGES = ["slurmdbd", "mariadb-server"]
SEARCH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin:/usr/local/sbin:/usr/local/bin"
BASE_PROGRAMS = ["slurmctld", "slurmd", "slurmstepd", "munged", "sinfo", "scontrol", "squeue", "sbatch", "srun"]
ACCOUNTING_PROGRAMS = ["slurmdbd", "mariadbd", "mariadb-install-db", "mariadb"]


class InstallError(RuntimeError):
    """Packages are missing and cannot be installed here."""


def find_program(name: str) -> Path | None:
    """Locate ``name`` on PATH or in the sbin directories a non-login PATH often lacks."""
    found = shutil.which(name) or shutil.which(name, path=SEARCH_PATH)
    return Path(found) if found else None


def missing_programs(accounting: bool) -> list[str]:
    names = BASE_PROGRAMS + (ACCOUNTING_PROGRAMS if accounting else [])
    return [n for n in names if find_program(n) is None]


def ensure_installed(accounting: bool, log: list[str]) -> None:
    """apt-get install the packages if any program is missing; ``apt-get update`` only if the install fails."""
    packages = BASE_PACKAGES + (ACCOUNTING_PACKAGES if accounting else [])
    ensure_packages(packages, BASE_PROGRAMS + (ACCOUNTING_PROGRAMS if accounting else []), log, what="Slurm")


def ensure_packages(packages: list[str], programs: list[str], log: list[str], what: str = "") -> None:
    """apt-get install ``packages`` when any of ``programs`` is missing (as root); ``apt-get update`` only if the
    install fails. Also used by the tests for their own tools (Debian's ``chromium``)."""
    missing = [n for n in programs if find_program(n) is None]
    if not missing:
        return
    label = f"{what} programs" if what else "programs"
    if os.geteuid() != 0:
        raise InstallError(
            f"{label} missing ({', '.join(missing)}) and not running as root "
            f"(fix: as root run `apt-get install -y --no-install-recommends {' '.join(packages)}`)"
        )
    apt = find_program("apt-get")
    if apt is None:
        raise InstallError(
            f"{label} missing ({', '.join(missing)}) and apt-get not found "
            f"(fix: install the packages {' '.join(packages)} with this system's package manager)"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [str(apt), "install", "-y", "--no-install-recommends", *packages]
    log.append(f"installing {' '.join(packages)}")
    first = subprocess.run(install, env=env, capture_output=True, text=True)
    if first.returncode != 0:
        log.append("apt-get install failed; running apt-get update and retrying")
        subprocess.run([str(apt), "update"], env=env, capture_output=True, text=True)
        second = subprocess.run(install, env=env, capture_output=True, text=True)
        if second.returncode != 0:
            tail = (second.stderr or second.stdout).strip().splitlines()[-3:]
            raise InstallError(
                f"apt-get install {' '.join(packages)} failed: {' | '.join(tail)} "
                "(fix: check the package sources and network, then rerun `up`)"
            )
    still = [n for n in programs if find_program(n) is None]
    if still:
        raise InstallError(f"after installing, programs still missing: {', '.join(still)}")

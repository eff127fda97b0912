"""A newer Slurm than the host's packages: a Debian chroot, made once and cached — Debian 13 (trixie) for Slurm
24.11, Debian unstable (sid) for Slurm 26.05.

Why a chroot: Debian 12 ships Slurm 22.05, Debian 13 ships 24.11, sid 26.05, and the supervisor must be proven on
each. The chroot holds only that release's Slurm and munge; the cluster's files, the checkout and the Python interpreter that runs
the project are bind-mounted at the *same paths* inside it, so a path means the same thing to the tests on the host
and to the daemons and jobs in the chroot (slurm.conf, pid files, spool sockets, campaign directories, /dev/shm
heartbeat slots).

Life cycle: ``ensure()`` debootstraps it the first time (about 2 minutes; into ``ROOT.partial``, renamed when
complete, so an interrupted run never leaves a half chroot that looks finished), installs what is missing, and
bind-mounts what the cluster needs (idempotent). ``release()`` stops what still runs inside (only processes whose
``/proc/PID/root`` is this chroot) and unmounts everything mounted under it, deepest first. Nothing here ever
deletes a directory that still has a mount inside it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from slurm.localcluster import procs

MIRROR = "http://deb.debian.org/debian"
CACHE = Path("/var/cache/slurm-supervisor")


@dataclass(frozen=True)
class Release:
    """A Debian release that carries the Slurm a ``--slurm`` choice names."""

    choice: str  # the --slurm value
    suite: str  # what debootstrap fetches
    os_version: str  # a host with this VERSION_ID has this Slurm itself: no chroot needed
    slurm: str  # the Slurm version it ships (messages only)


RELEASES = {"24": Release("24", "trixie", "13", "24.11"), "26": Release("26", "sid", "14", "26.05")}
# Slurm itself, plus the shared libraries a host-built CPython (pyenv, python.org) loads from the system for the
# standard modules the project and its tests use (ctypes, ssl, sqlite3, bz2, lzma, readline, uuid).
PACKAGES = [
    "slurmctld", "slurmd", "slurm-client", "munge",
    "libffi8", "libssl3t64", "libsqlite3-0", "libbz2-1.0", "liblzma5", "zlib1g", "libreadline8t64",
    "libncursesw6", "libuuid1", "libgdbm6t64", "procps",
]
# Written last by ensure(): its presence means "complete". Wrapper scripts also test for it to know they already
# run inside the chroot (a job's environment inherits the wrappers' PATH from the submitting host shell).
MARKER = "etc/slurm-supervisor-chroot"
SBIN_PROGRAMS = ["slurmctld", "slurmd", "slurmstepd", "munged"]
CLIENT_PROGRAMS = ["sbatch", "squeue", "sinfo", "scontrol", "scancel", "srun", "sacct", "sprio", "sstat", "sattach"]
# Host directories the cluster's processes must see at the same path (besides the checkout and the interpreter).
SYSTEM_BINDS = [Path("/proc"), Path("/sys"), Path("/dev"), Path("/dev/pts"), Path("/dev/shm"), Path("/tmp")]


class ChrootError(RuntimeError):
    """The chroot cannot be made, mounted or released; the message names the problem and the fix."""


def default_chroot(release: Release = RELEASES["24"]) -> Path:
    """$SUPERVISOR_SLURM_CHROOT_<choice> (for 24 also $SUPERVISOR_SLURM_CHROOT), else
    /var/cache/slurm-supervisor/<suite> (outside any git checkout)."""
    env = os.environ.get(f"SUPERVISOR_SLURM_CHROOT_{release.choice}")
    if not env and release.choice == "24":
        env = os.environ.get("SUPERVISOR_SLURM_CHROOT")
    return Path(env).resolve() if env else CACHE / release.suite


def host_os_version() -> str:
    """VERSION_ID from /etc/os-release (``"12"``, ``"13"``), or ``""`` if unknown."""
    try:
        text = Path("/etc/os-release").read_text()
    except OSError:
        return ""
    for line in text.splitlines():
        if line.startswith("VERSION_ID="):
            return line.split("=", 1)[1].strip().strip('"')
    return ""


def _unescape_mountinfo(field_text: str) -> str:
    """mountinfo writes space, tab, newline and backslash in paths as octal escapes."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field_text = field_text.replace(code, char)
    return field_text


def mount_points(mountinfo: str) -> list[Path]:
    """Mount points listed in a /proc/self/mountinfo text (field 5), in the order listed."""
    points = []
    for line in mountinfo.splitlines():
        parts = line.split()
        if len(parts) >= 5:
            points.append(Path(_unescape_mountinfo(parts[4])))
    return points


def is_under(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def inside_path(root: Path, name: str, dirs: Sequence[str]) -> str | None:
    """The path (as seen inside the chroot) of program ``name`` in one of ``dirs``, or None."""
    for d in dirs:
        candidate = f"{d}/{name}"
        if os.path.lexists(root / candidate.lstrip("/")):
            return candidate
    return None


def resolve_inside(root: Path, inner: str) -> Path:
    """Host path of the file that ``inner`` (a path inside the chroot) finally names, following symlinks the way
    the chroot sees them (Debian's /usr/sbin/slurmd -> /etc/alternatives/slurmd -> /usr/sbin/slurmd-wlm)."""
    current = inner
    for _ in range(40):
        host = root / current.lstrip("/")
        if not host.is_symlink():
            parent = Path(current).parent
            real_parent = resolve_inside(root, str(parent)) if str(parent) != "/" else root
            return real_parent / Path(current).name
        target = os.readlink(host)
        current = target if target.startswith("/") else str(Path(current).parent / target)
    raise ChrootError(f"too many symlinks resolving {inner} inside {root}")


@dataclass
class Chroot:
    """One Debian chroot of the ``debian`` release at ``root`` and the host paths to bind-mount into it."""

    root: Path = field(default=Path())  # Path(): default_chroot(debian)
    debian: Release = RELEASES["24"]

    def __post_init__(self) -> None:
        if self.root == Path():
            self.root = default_chroot(self.debian)

    # ----- paths ----------------------------------------------------------------------------------------------
    @property
    def complete(self) -> bool:
        return (self.root / MARKER).exists()

    def program(self, name: str) -> Path | None:
        """Host path of the binary that runs as ``name`` inside the chroot (what /proc/PID/exe shows from the
        host), or None if it is not installed there."""
        inner = inside_path(self.root, name, ["/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        if inner is None:
            return None
        real = resolve_inside(self.root, inner)
        return real if real.exists() else None

    def command(self, name: str, argv: Sequence[str]) -> list[str]:
        """Argument list that runs program ``name`` inside the chroot (chroot(1) also changes to /)."""
        inner = inside_path(self.root, name, ["/usr/sbin", "/usr/bin", "/sbin", "/bin"])
        if inner is None:
            raise ChrootError(f"{name} is not installed in {self.root} (fix: `python -m slurm.localcluster up "
                              f"--slurm {self.debian.choice}` installs it)")
        return [str(_host_program("chroot")), str(self.root), inner, *argv]

    # ----- creation -------------------------------------------------------------------------------------------
    def ensure(self, binds: Iterable[Path], log: list[str]) -> None:
        """Make the chroot if it is missing, install what is missing in it, and bind-mount ``binds``."""
        if os.geteuid() != 0:
            raise ChrootError(f"a Slurm {self.debian.slurm} chroot needs root (fix: run as root, or on a host "
                              f"whose own packages are Slurm {self.debian.slurm} use them)")
        if not self.complete:
            self._create(log)
        self._mount_all(SYSTEM_BINDS, log)
        self._install_missing(log)
        self._mount_all(binds, log)

    def _create(self, log: list[str]) -> None:
        partial = self.root.with_name(self.root.name + ".partial")
        if self.mounts_under(partial):
            raise ChrootError(f"{partial} still has mounts inside (fix: unmount them: "
                              f"`umount -R {partial}`, then rerun)")
        if self.root.exists() and not self.complete:
            if self.mounts_under(self.root):
                raise ChrootError(f"{self.root} is incomplete but has mounts inside (fix: `python -m "
                                  f"slurm.localcluster down --slurm {self.debian.choice}`, then rerun)")
            shutil.rmtree(self.root)
        if partial.exists():
            shutil.rmtree(partial)  # an interrupted debootstrap: start over (no mounts inside, checked above)
        debootstrap = _host_program("debootstrap", install="debootstrap")
        partial.parent.mkdir(parents=True, exist_ok=True)
        suite = self.debian.suite
        log.append(f"creating the Debian {suite} chroot {self.root} with debootstrap (about 2 minutes, ~300 MB)")
        res = subprocess.run(
            [str(debootstrap), "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(partial), MIRROR],
            capture_output=True, text=True, stdin=subprocess.DEVNULL,
        )
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-5:]
            raise ChrootError(f"debootstrap {suite} failed: {' | '.join(tail)} (fix: check that {MIRROR} is "
                              f"reachable; the log is {partial}/debootstrap/debootstrap.log)")
        self._finish(partial)
        partial.rename(self.root)

    def _finish(self, root: Path) -> None:
        """Name resolution as on the host (the cluster's nodes are this host), then the completion marker."""
        for name in ("etc/hosts", "etc/resolv.conf"):
            src = Path("/") / name
            if src.exists():
                shutil.copyfile(src, root / name)
        (root / MARKER).write_text(f"Debian {self.debian.suite} chroot made by slurm.localcluster for Slurm "
                                   f"{self.debian.slurm}\n")  # fmt: skip

    def _install_missing(self, log: list[str]) -> None:
        missing = [n for n in SBIN_PROGRAMS + ["sbatch", "srun", "scontrol"] if self.program(n) is None]
        if not missing:
            return
        log.append(f"installing {' '.join(PACKAGES)} in {self.root} (missing: {', '.join(missing)})")
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive", "LANG": "C.UTF-8"}
        base = [str(_host_program("chroot")), str(self.root), "apt-get"]
        res = subprocess.run([*base, "install", "-y", "--no-install-recommends", *PACKAGES], env=env,
                             capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            subprocess.run([*base, "update"], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            res = subprocess.run([*base, "install", "-y", "--no-install-recommends", *PACKAGES], env=env,
                                 capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise ChrootError(f"apt-get install in {self.root} failed: {' | '.join(tail)}")

    # ----- mounts ---------------------------------------------------------------------------------------------
    def mounts_under(self, root: Path | None = None) -> list[Path]:
        base = root or self.root
        return [p for p in mount_points(Path("/proc/self/mountinfo").read_text()) if is_under(p, base)]

    def _mount_all(self, sources: Iterable[Path], log: list[str]) -> None:
        mounted = set(self.mounts_under())
        for source in sources:
            source = Path(os.path.realpath(source))
            if is_under(self.root, source) and source != Path("/"):
                raise ChrootError(f"cannot bind {source} into {self.root}: the chroot lies inside it")
            target = self.root / str(source).lstrip("/")
            if target in mounted:
                continue
            if not source.is_dir():
                raise ChrootError(f"cannot bind {source} into the chroot: not a directory")
            target.mkdir(parents=True, exist_ok=True)
            res = subprocess.run([str(_host_program("mount")), "--bind", str(source), str(target)],
                                 capture_output=True, text=True)
            if res.returncode != 0:
                raise ChrootError(f"mount --bind {source} {target} failed: {(res.stderr or res.stdout).strip()}")
            mounted.add(target)
            log.append(f"bind-mounted {source} into the chroot")

    def processes(self) -> list[int]:
        """Pids of the processes running inside this chroot (``/proc/PID/root`` is it)."""
        found = []
        root = str(self.root)
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    if os.readlink(f"/proc/{entry.name}/root") == root:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def release_unless_shared(self, daemons: Iterable[Path], log: list[str]) -> None:
        """``release()``, unless one of the ``daemons`` programs (another cluster's, since the caller stopped
        its own) still runs inside: then leave everything mounted and say so."""
        programs = list(daemons)
        others = [pid for pid in self.processes() if any(procs.is_our_process(pid, p) for p in programs)]
        if others:
            log.append(f"chroot left mounted: another cluster's daemons run in it (pids {sorted(others)})")
            return
        self.release(log)

    def release(self, log: list[str], timeout: float = 15.0) -> None:
        """Stop every process left inside the chroot (SIGTERM, then SIGKILL), then unmount all mounts under it,
        deepest first. Raises if something stays mounted."""
        leftover = self.processes()
        if leftover:
            killed = procs.terminate(leftover, timeout)
            log.append(f"stopped {len(leftover)} process(es) left in the chroot: {sorted(leftover)}"
                       + (f" ({len(killed)} with SIGKILL)" if killed else ""))
        for point in sorted(self.mounts_under(), key=lambda p: len(p.parts), reverse=True):
            if point == self.root:
                continue
            res = subprocess.run([str(_host_program("umount")), str(point)], capture_output=True, text=True)
            if res.returncode != 0:
                time.sleep(0.5)  # a process that just exited may still hold it for a moment
                res = subprocess.run([str(_host_program("umount")), str(point)], capture_output=True, text=True)
            if res.returncode != 0:
                raise ChrootError(f"umount {point} failed: {(res.stderr or res.stdout).strip()} (fix: see "
                                  f"`fuser -m {point}`, stop that, rerun down)")
        remaining = [p for p in self.mounts_under() if p != self.root]
        if remaining:
            raise ChrootError(f"still mounted under {self.root}: {', '.join(map(str, remaining))}")
        log.append(f"unmounted everything under {self.root}")

    # ----- client wrappers -----------------------------------------------------------------------------------
    def write_wrappers(self, bindir: Path) -> Path:
        """One small script per Slurm client in ``bindir``: on the host it runs the chroot's program (in the
        caller's working directory, arguments passed through as an argument list); inside the chroot (a job that
        inherited this PATH) it runs the program directly. Put ``bindir`` first on PATH."""
        bindir.mkdir(parents=True, exist_ok=True)
        chroot_bin = _host_program("chroot")
        for name in CLIENT_PROGRAMS:
            inner = inside_path(self.root, name, ["/usr/bin", "/usr/sbin"])
            if inner is None:
                continue
            text = (
                "#!/bin/sh\n"
                f"# written by slurm.localcluster: {name} of the Slurm {self.debian.slurm} chroot {self.root}\n"
                f'if [ -e /{MARKER} ]; then exec {inner} "$@"; fi\n'
                f'exec {chroot_bin} {self.root} /bin/sh -c \'cd "$1" 2>/dev/null || cd /; shift; exec "$@"\' '
                f'sh "$PWD" {inner} "$@"\n'
            )
            path = bindir / name
            tmp = path.with_name(name + ".tmp")
            tmp.write_text(text)
            tmp.chmod(0o755)
            tmp.replace(path)
        return bindir


def _host_program(name: str, install: str | None = None) -> Path:
    from slurm.localcluster.install import find_program

    path = find_program(name)
    if path is None and install is not None and os.geteuid() == 0:
        apt = find_program("apt-get")
        if apt is not None:
            subprocess.run([str(apt), "install", "-y", "--no-install-recommends", install],
                           env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, capture_output=True)
            path = find_program(name)
    if path is None:
        raise ChrootError(f"host program {name!r} not found (fix: `apt-get install {install or name}`)")
    return path


def interpreter_binds() -> list[Path]:
    """The running interpreter's prefixes (venv and base installation), so the project's Python runs inside."""
    return sorted({Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)})


def cluster_binds(checkout: Path, cluster_root: Path) -> list[Path]:
    """What a chroot cluster's daemons and jobs must see at the host's paths: the checkout, the interpreter that
    runs the project, and the cluster directory (unless it lies in one of those)."""
    binds = [checkout, *interpreter_binds()]
    if not any(is_under(cluster_root, b) for b in binds):
        binds.append(cluster_root)
    return binds

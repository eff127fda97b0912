"""A real multi-node Slurm cluster on this one host, owned by the project (tests and the demo start it).

``LocalCluster`` runs a private munged, a slurmctld and N slurmd (``slurmd -N nodeK``, each on its own port),
with every file (config, munge key, state, spool, logs, pids) under one ROOT directory, so it never touches the
system's Slurm and can coexist with other such clusters on other ports. ``crash_node`` kills a node's slurmd and
its job steps like a lost machine would; ``revive_node`` brings it back.

``slurm="24"`` (or $SUPERVISOR_CLUSTER_SLURM=24) runs Debian 13's Slurm 24.11 instead of the host's packages, ``"26"``
Debian sid's 26.05: on a host whose own packages are that version those are used; elsewhere the daemons run in a
Debian chroot (see ``chroot.py``) and clients reach them through wrapper scripts in ROOT/bin, which ``env`` puts
first on PATH.
"""

from __future__ import annotations

import os
import pwd
import re
import socket
import subprocess
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from slurm.localcluster import accounting, procs
from slurm.localcluster.chroot import RELEASES, Chroot, ChrootError, cluster_binds, host_os_version
from slurm.localcluster.config import (
    CRASH_HOLD_S,
    DEFAULT_BASE_PORT,
    DEFAULT_NODES,
    SLURM_CHOICES,
    ClusterSpec,
    Layout,
    crash_marker,
    default_root,
    default_slurm,
    default_topology,
    parse_version,
    render_cgroup_conf,
    render_slurm_conf,
    render_topology_conf,
    repo_root,
)
from slurm.localcluster.errors import ClusterError
from slurm.localcluster.files import locked, tail, write_if_changed
from slurm.localcluster.install import InstallError, ensure_installed, find_program
from slurm.localcluster.node_memory import wipe_node_memory

__all__ = ["CRASH_HOLD_S", "SLURM_CHOICES", "ClusterError", "LocalCluster", "default_root", "default_slurm"]

# Node state words (scontrol's State=BASE+FLAG+...) under which a node can run jobs.
USABLE_BASE_STATES = {"IDLE", "MIXED", "ALLOCATED", "COMPLETING"}
UNUSABLE_FLAGS = {"NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "REBOOT_REQUESTED"}

class LocalCluster:
    """One local cluster: ROOT directory, ports ``base_port`` (slurmctld) and ``base_port+1..+nodes`` (slurmd);
    ``crash_node`` / ``revive_node`` take a node down and back."""

    def __init__(
        self,
        root: Path | str | None = None,
        base_port: int = DEFAULT_BASE_PORT,
        nodes: int = DEFAULT_NODES,
        accounting: bool = False,
        slurm: str | None = None,
        topology: bool | None = None,
    ) -> None:
        """``topology``: two leaf switches (topology/tree); None: $SUPERVISOR_CLUSTER_TOPOLOGY."""
        slurm = slurm or default_slurm()
        if slurm not in SLURM_CHOICES:
            raise ClusterError(f"--slurm {slurm!r} is not supported (fix: use one of {', '.join(SLURM_CHOICES)})")
        # A host whose own packages are that Slurm (Debian 13: 24.11) needs no chroot.
        release = RELEASES.get(slurm)
        self.chroot = Chroot(debian=release) if release is not None and host_os_version() != release.os_version else None
        if self.chroot is not None and accounting:
            raise ClusterError(f"--accounting is not supported with --slurm {slurm} on this host (fix: drop "
                               "--accounting; sacct needs slurmdbd + MariaDB, which the chroot does not carry)")
        self.slurm_choice = slurm
        if nodes < 1:
            raise ClusterError(f"--nodes must be at least 1, got {nodes}")
        if not 1024 <= base_port <= 65535 - nodes - 2:
            raise ClusterError(f"--base-port {base_port} out of range (fix: pick a port in 1024-{65533 - nodes})")
        self.layout = Layout(Path(root).resolve() if root is not None else default_root(slurm))
        self.spec = ClusterSpec(
            layout=self.layout,
            hostname=socket.gethostname().split(".")[0],
            user=pwd.getpwuid(os.geteuid()).pw_name,
            base_port=base_port,
            nodes=nodes,
            accounting=accounting,
            topology=default_topology() if topology is None else topology,
        )
        self.log: list[str] = []  # progress lines of the last up/down, for the CLI

    # ----- public properties -------------------------------------------------------------------------------
    @property
    def root(self) -> Path:
        return self.layout.root

    @property
    def conf(self) -> Path:
        return self.layout.conf

    @property
    def bin_dir(self) -> Path:
        """Where the client wrappers into the chroot live (only used with a chroot)."""
        return self.root / "bin"

    @property
    def env(self) -> dict[str, str]:
        """Environment variables that point Slurm clients at this cluster (and, with a chroot, PATH at the
        wrappers that run the chroot's clients)."""
        env = {"SLURM_CONF": str(self.conf)}
        if self.chroot is not None:
            path = os.environ.get("PATH", "")
            parts = [p for p in path.split(os.pathsep) if p and p != str(self.bin_dir)]
            env["PATH"] = os.pathsep.join([str(self.bin_dir), *parts])
        return env

    @property
    def node_names(self) -> list[str]:
        return self.spec.node_names

    # ----- running Slurm commands -----------------------------------------------------------------------------
    def _program(self, name: str) -> Path:
        """Host path of program ``name`` as the daemons' /proc/PID/exe shows it (inside the chroot if any)."""
        path = find_program(name) if self.chroot is None else self.chroot.program(name)
        if path is None:
            flag = "" if self.chroot is None else f" --slurm {self.chroot.debian.choice}"
            raise ClusterError(f"program {name!r} not found (fix: run `python -m slurm.localcluster up{flag}` as "
                               "root to install the Slurm packages)")
        return path

    def _command(self, name: str, argv: Sequence[str]) -> list[str]:
        """Argument list that runs program ``name`` (in the chroot if any) with ``argv``."""
        if self.chroot is None:
            return [str(self._program(name)), *argv]
        self._program(name)  # a clear error if it is missing
        return self.chroot.command(name, argv)

    def slurm(self, *argv: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command (``sinfo``, ``scontrol``...) against this cluster."""
        env = {**os.environ, **self.env}
        cmd = self._command(argv[0], argv[1:])
        try:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise ClusterError(f"`{' '.join(argv)}` timed out after {timeout:.0f} s") from e
        if check and res.returncode != 0:
            raise ClusterError(f"`{' '.join(argv)}` failed: {(res.stderr or res.stdout).strip()}")
        return res

    def version(self) -> tuple[int, int, int]:
        out = subprocess.run(self._command("slurmctld", ["-V"]), capture_output=True, text=True)
        return parse_version(out.stdout + out.stderr)

    # ----- daemons ----------------------------------------------------------------------------------------------
    def accounting_active(self) -> bool:
        """Accounting was asked for now, or an earlier ``up --accounting`` left its daemons recorded here."""
        lay = self.layout
        return self.spec.accounting or lay.pid_file("slurmdbd").exists() or lay.pid_file("mariadbd").exists()

    def _daemon_table(self) -> dict[str, tuple[str, list[str], list[str]]]:
        """name -> (program, argv after the program, identity marks). The marks (argv words) tell our live daemon
        from a recycled pid or another cluster's daemon running the same program."""
        lay = self.layout
        socket_arg = f"--socket={lay.munge_socket}"
        table: dict[str, tuple[str, list[str], list[str]]] = {
            "munged": ("munged", [
                socket_arg,
                f"--key-file={lay.munge_key}",
                f"--pid-file={lay.pid_file('munged')}",
                f"--log-file={lay.log_file('munged')}",
                f"--seed-file={lay.munge_dir / 'munged.seed'}",
            ], [socket_arg]),
        }
        if self.accounting_active():
            db_argv = accounting.mariadbd_argv(self.spec)
            table["mariadbd"] = ("mariadbd", db_argv, [a for a in db_argv if a.startswith("--datadir=")])
            table["slurmdbd"] = ("slurmdbd", [], [])  # its pid file under ROOT is the only identity it has
        table["slurmctld"] = ("slurmctld", ["-f", str(self.conf), "-i"], ["-f", str(self.conf)])
        for node in self.node_names:
            argv = ["-f", str(self.conf), "-N", node]
            table[f"slurmd-{node}"] = ("slurmd", argv, argv)
        return table

    def pid_of(self, name: str) -> int | None:
        """Pid of the live daemon ``name`` (``munged``, ``slurmctld``, ``slurmd-nodeK``) of this cluster, or None."""
        program, _argv, marks = self._daemon_table()[name]
        return procs.alive_daemon(self.layout.pid_file(name), self._program(program), marks)

    def pids(self) -> dict[str, int | None]:
        return {name: self.pid_of(name) for name in self._daemon_table()}

    def _port_of(self, name: str) -> int | None:
        spec = self.spec
        ports = {"slurmctld": spec.ctld_port, "slurmdbd": spec.dbd_port, "mariadbd": spec.db_port}
        ports.update({f"slurmd-{n}": spec.node_port(n) for n in self.node_names})
        return ports.get(name)

    def _start(self, name: str, timeout: float, prefix: Sequence[str] = ()) -> int:
        """Start daemon ``name`` detached from us (it writes its own pid file) and wait until it is alive;
        ``prefix``: an argument list it runs under (``reboot.fresh_boot``)."""
        program, argv, _marks = self._daemon_table()[name]
        log_file = self.layout.log_file(name)
        port = self._port_of(name)
        if port is not None and procs.port_in_use(port):
            raise ClusterError(f"port {port} needed by {name} is already in use by another program (fix: stop it, "
                               "or choose other ports with --base-port; see `ss -ltnp`)")
        self.layout.pid_file(name).unlink(missing_ok=True)
        cmd = [*prefix, *self._command(program, argv)]
        env = {**os.environ, **self.env}
        if program == "mariadbd":  # does not daemonize itself: `setsid -f` detaches it so init becomes its parent
            with open(log_file, "ab") as out:
                res = subprocess.run([str(self._program("setsid")), "-f", *cmd], env=env, stdout=out, stderr=out,
                                     stdin=subprocess.DEVNULL, timeout=timeout, text=True)
        else:
            res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                                 stdin=subprocess.DEVNULL)
        if res.returncode != 0:
            raise ClusterError(f"{name} failed to start (exit {res.returncode}): "
                               f"{(res.stderr or res.stdout or '').strip()}\n{tail(log_file)}")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pid = self.pid_of(name)
            if pid is not None:
                self.log.append(f"started {name} (pid {pid})")
                return pid
            time.sleep(0.05)
        raise ClusterError(f"{name} did not come up within {timeout:.0f} s; last lines of {log_file}:\n"
                           f"{tail(log_file)}")

    # ----- preparation -----------------------------------------------------------------------------------------
    def _prepare_files(self) -> None:
        lay = self.layout
        for path, mode in [(lay.root, 0o755), (lay.etc, 0o755), (lay.run, 0o755), (lay.spool, 0o755),
                           (lay.munge_dir, 0o700), (lay.state, 0o700), (lay.log, 0o700)]:
            path.mkdir(parents=True, exist_ok=True)
            os.chmod(path, mode)
        for node in self.node_names:
            lay.node_spool(node).mkdir(exist_ok=True)
            os.chmod(lay.node_spool(node), 0o755)
        if not lay.munge_key.exists():
            fd = os.open(lay.munge_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(os.urandom(1024))
                f.flush()
                os.fsync(f.fileno())
        os.chmod(lay.munge_key, 0o600)
        conf = render_slurm_conf(self.spec)
        running = [name for name, pid in self.pids().items() if pid is not None and name.startswith("slurm")]
        if running and lay.conf.exists() and lay.conf.read_text() != conf:
            raise ClusterError(
                f"the cluster in {lay.root} is running with other settings (ports/nodes/accounting/topology) than requested "
                "(fix: run `python -m slurm.localcluster down` with its old settings first, or use another --root)"
            )
        write_if_changed(lay.conf, conf, 0o644)
        if self.spec.topology:
            write_if_changed(lay.topology_conf, render_topology_conf(self.spec), 0o644)
        write_if_changed(lay.cgroup_conf, render_cgroup_conf(self.version()), 0o644)
        write_if_changed(lay.plugstack_conf, "", 0o644)
        if self.spec.accounting:
            write_if_changed(accounting.dbd_conf(self.spec), accounting.dbd_conf_text(self.spec), 0o600)

    def _prepare_chroot(self) -> None:
        assert self.chroot is not None
        self.root.mkdir(parents=True, exist_ok=True)
        self.chroot.ensure(cluster_binds(repo_root(), self.root), self.log)
        self.chroot.write_wrappers(self.bin_dir)

    def _check_multiple_slurmd(self) -> None:
        out = self.slurm("scontrol", "show", "config").stdout
        if not re.search(r"MULTIPLE_SLURMD\s*=\s*yes", out, re.IGNORECASE):  # 22.05 "Yes", 24.11 "yes"
            raise ClusterError(
                "this Slurm build lacks multiple-slurmd support (no MULTIPLE_SLURMD in `scontrol show config`), "
                "so several nodes cannot run on one host (fix: use the Debian slurm-wlm packages, or a Slurm "
                "built with --enable-multiple-slurmd)"
            )

    # ----- lifecycle --------------------------------------------------------------------------------------------
    def up(self, timeout: float = 60.0) -> list[str]:
        """Start whatever of this cluster is not running and wait until every node is usable.

        Idempotent: live daemons are left alone. Returns the names of the daemons it started.
        """
        with locked(self.root, timeout, ClusterError):
            return self._up(timeout)

    def _up(self, timeout: float) -> list[str]:
        self.log = []
        try:
            if self.chroot is None:
                ensure_installed(self.spec.accounting, self.log)
            else:
                self._prepare_chroot()
        except (InstallError, ChrootError) as e:
            raise ClusterError(str(e)) from e
        deadline = time.monotonic() + timeout  # installing packages (minutes on a slow mirror) does not count
        self._prepare_files()
        started: list[str] = []
        if self.pid_of("munged") is None:
            self._start("munged", max(5.0, deadline - time.monotonic()))
            started.append("munged")
        if self.spec.accounting:
            started += self._up_accounting(deadline)
        if self.pid_of("slurmctld") is None:
            self._start("slurmctld", max(5.0, deadline - time.monotonic()))
            started.append("slurmctld")
        self._wait_ctld(deadline)
        held = self.crashed_nodes()
        for node in held:
            self.log.append(f"{node} left down: crashed on purpose by crash-node (revive-node brings it back)")
        to_start = [n for n in self.node_names if n not in held and self.pid_of(f"slurmd-{n}") is None]
        if to_start:
            self._check_multiple_slurmd()
        for node in to_start:
            self._start(f"slurmd-{node}", max(5.0, deadline - time.monotonic()))
            started.append(f"slurmd-{node}")
        self._wait_nodes_usable([n for n in self.node_names if n not in held], deadline, restarted=set(to_start))
        for node, state in self.node_states().items():
            if "DRAIN" in state.split("+"):
                self.log.append(f"warning: {node} is {state}: it takes no new jobs until "
                                f"`scontrol update nodename={node} state=resume`")
        if not started:
            self.log.append("already up: no daemon needed starting")
        return started

    def _up_accounting(self, deadline: float) -> list[str]:
        started = []
        try:
            if self.pid_of("mariadbd") is None:
                accounting.initialise_db(self.spec, self._program("mariadb-install-db"))
                self._start("mariadbd", max(5.0, deadline - time.monotonic()))
                started.append("mariadbd")
            accounting.grant_slurm_user(self.spec, self._program("mariadb"), max(5.0, deadline - time.monotonic()))
        except RuntimeError as e:
            raise ClusterError(f"{e}\n{tail(self.layout.log_file('mariadbd'))}") from e
        if self.pid_of("slurmdbd") is None:
            self._start("slurmdbd", max(5.0, deadline - time.monotonic()))
            started.append("slurmdbd")
        # slurmctld exits ("no TRES from the database") if slurmdbd is not answering yet when it starts.
        if not procs.wait_port("127.0.0.1", self.spec.dbd_port, deadline):
            raise ClusterError(f"slurmdbd does not listen on port {self.spec.dbd_port}:\n"
                               f"{tail(self.layout.log_file('slurmdbd'))}")
        return started

    def _wait_ctld(self, deadline: float) -> None:
        while True:
            res = self.slurm("scontrol", "ping", check=False, timeout=10)
            if res.returncode == 0 and "UP" in res.stdout:
                return
            dead = self.pid_of("slurmctld") is None
            if dead or time.monotonic() > deadline:
                why = "slurmctld exited" if dead else "slurmctld does not answer `scontrol ping`"
                raise ClusterError(f"{why}; last lines of its log:\n{tail(self.layout.log_file('slurmctld'))}")
            time.sleep(0.1)

    def node_states(self) -> dict[str, str]:
        """node -> scontrol state string, e.g. ``IDLE``, ``MIXED``, ``DOWN+NOT_RESPONDING``."""
        out = self.slurm("scontrol", "show", "node", "-o").stdout
        states = {}
        for line in out.splitlines():
            name = re.search(r"NodeName=(\S+)", line)
            state = re.search(r"\bState=(\S+)", line)
            if name and state:
                states[name.group(1)] = state.group(1)
        return states

    @staticmethod
    def is_usable(state: str) -> bool:
        words = state.split("+")
        return words[0] in USABLE_BASE_STATES and not UNUSABLE_FLAGS.intersection(words[1:])

    def _wait_nodes_usable(self, nodes: Iterable[str], deadline: float, restarted: set[str]) -> None:
        nodes = list(nodes)
        resumed: set[str] = set()
        states: dict[str, str] = {}
        while True:
            states = self.node_states()
            bad = [n for n in nodes if not self.is_usable(states.get(n, "MISSING"))]
            if not bad:
                return
            for n in bad:
                words = states.get(n, "").split("+")
                # A restarted slurmd registered, but slurmctld keeps the node DOWN (e.g. after a crash): resume it.
                if n in restarted and n not in resumed and words[0] == "DOWN" and "NOT_RESPONDING" not in words:
                    self.slurm("scontrol", "update", f"nodename={n}", "state=resume", check=False)
                    resumed.add(n)
            if time.monotonic() > deadline:
                summary = ", ".join(f"{n}={states.get(n, 'MISSING')}" for n in bad)
                raise ClusterError(
                    f"nodes not usable before the timeout: {summary}; last lines of "
                    f"{self.layout.log_file('slurmd-' + bad[0])}:\n{tail(self.layout.log / f'slurmd-{bad[0]}.log')}"
                    f"\nlast lines of slurmctld.log:\n{tail(self.layout.log_file('slurmctld'))}"
                )
            time.sleep(0.1)

    def wait_node_state(self, name: str, states: Iterable[str], timeout: float = 60.0) -> str:
        """Wait until node ``name``'s state has one of the words ``states`` (e.g. ``{"DOWN"}``,
        ``{"NOT_RESPONDING"}``, ``{"IDLE"}``); returns the full state string."""
        wanted = {s.upper() for s in states}
        deadline = time.monotonic() + timeout
        state = "MISSING"
        while True:
            state = self.node_states().get(name, "MISSING")
            if wanted.intersection(state.split("+")):
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"node {name} did not reach {sorted(wanted)} within {timeout:.0f} s "
                                   f"(last state {state})")
            time.sleep(0.2)

    def stepd_pids(self, node: str) -> set[int]:
        """Pids of the slurmstepd processes of ``node``, found via the unix sockets in its spool directory."""
        spool = self.layout.node_spool(node)
        try:
            sockets = [p for p in spool.iterdir() if p.is_socket()]
        except FileNotFoundError:
            return set()
        stepd = self._program("slurmstepd")
        return {pid for pid in procs.pids_holding_sockets(sockets) if procs.is_our_process(pid, stepd)}

    # ----- node faults: crash_node loses a node as a dead machine would, revive_node brings it back ----------
    # A crash is marked in ROOT/run, so that ``up`` (another test session's fixture) leaves the node down for
    # CRASH_HOLD_S instead of reviving it behind the back of the test that crashed it.
    def crashed_nodes(self) -> list[str]:
        """Nodes that crash-node took down less than CRASH_HOLD_S ago: ``up`` (e.g. another test session's
        fixture) must not revive them behind the back of the test that crashed them. Older marks are ignored, so a
        test that died before reviving its node does not keep the node down forever."""
        held = []
        for node in self.node_names:
            try:
                age = time.time() - crash_marker(self.layout, node).stat().st_mtime
            except FileNotFoundError:
                continue
            if age < CRASH_HOLD_S:
                held.append(node)
        return held

    def crash_node(self, name: str) -> dict[str, list[Any]]:
        """Simulate losing node ``name``: SIGKILL its slurmd and its slurmstepds with their process trees, so the
        job tasks on it die as on a real crash, and remove what it held in /dev/shm (``node_memory``). Returns
        {"slurmd": [...], "killed": [all pids killed], "wiped": [its /dev/shm directories removed]}."""
        return self.crash_nodes([name])

    def crash_nodes(self, names: list[str]) -> dict[str, list[Any]]:
        """Lose several nodes at the same instant (a rack, a switch): every one's processes are frozen before any
        is killed, so nothing sees one gone while another still runs."""
        for name in names:
            self._check_node(name)
        with locked(self.root, 30.0, ClusterError):
            return self._crash_nodes(names)

    def revive_node(self, name: str, timeout: float = 60.0) -> bool:
        """Start node ``name``'s slurmd again if it is dead, resume the node if slurmctld marked it DOWN, and wait
        until it is usable. Returns True if a slurmd was started."""
        self._check_node(name)
        with locked(self.root, timeout, ClusterError):
            return self._revive_node(name, timeout)

    def reboot_node(self, name: str, timeout: float = 60.0) -> None:
        """What a node's reboot does to it, as Slurm's RebootProgram would (``reboot.py``): its slurmd, job steps
        and /dev/shm are lost, then its slurmd starts again reporting a boot time of now, so slurmctld completes
        a ``scontrol reboot`` (and its ``nextstate``) as after a real one."""
        self._check_node(name)
        if self.chroot is not None:
            raise ClusterError("reboot-node needs the host's Slurm (fix: use the cluster without --slurm)")
        from slurm.localcluster.reboot import fresh_boot

        with locked(self.root, timeout, ClusterError):
            self._crash_nodes([name])
            crash_marker(self.layout, name).unlink(missing_ok=True)
            self._start(f"slurmd-{name}", timeout, prefix=fresh_boot())

    def _check_node(self, name: str) -> None:
        if name not in self.node_names:
            raise ClusterError(f"unknown node {name!r} (fix: use one of {', '.join(self.node_names)})")

    def _crash_nodes(self, names: list[str]) -> dict[str, list[Any]]:
        slurmds = [pid for name in names if (pid := self.pid_of(f"slurmd-{name}")) is not None]
        roots = slurmds + sorted(pid for name in names for pid in self.stepd_pids(name))
        what = f"crash-node {' '.join(names)}"
        try:
            killed = procs.freeze_and_kill(roots)
        except RuntimeError as e:
            raise ClusterError(f"{what}: {e}") from e
        leftover = sorted(pid for name in names for pid in self.stepd_pids(name))
        if leftover:
            raise ClusterError(f"{what}: slurmstepd processes still alive: {leftover}")
        for name in names:
            crash_marker(self.layout, name).touch()
        return {"slurmd": slurmds, "killed": killed, "wiped": [d for name in names for d in wipe_node_memory(name)]}

    def _revive_node(self, name: str, timeout: float) -> bool:
        crash_marker(self.layout, name).unlink(missing_ok=True)
        deadline = time.monotonic() + timeout
        started = False
        if self.pid_of(f"slurmd-{name}") is None:
            self._start(f"slurmd-{name}", timeout)
            started = True
        self._wait_nodes_usable([name], deadline, restarted={name})
        return started

    def down(self, timeout: float = 20.0) -> list[str]:
        """Stop only the daemons this cluster recorded (SIGTERM all at once, SIGKILL stragglers) and any job steps
        left on its nodes. Returns the names of the daemons that were running."""
        with locked(self.root, timeout, ClusterError):
            return self._down(timeout)

    def _down(self, timeout: float) -> list[str]:
        self.log = []
        stepds = set().union(*(self.stepd_pids(n) for n in self.node_names))
        running = {name: pid for name, pid in self.pids().items() if pid is not None}
        last = ("munged", "mariadbd")  # slurm daemons may still talk to these while shutting down
        killed = procs.terminate([pid for name, pid in running.items() if name not in last], timeout)
        if stepds:
            procs.freeze_and_kill(stepds)
            self.log.append(f"killed {len(stepds)} slurmstepd process tree(s)")
        killed += procs.terminate([pid for name, pid in running.items() if name in last], timeout)
        for node in self.node_names:
            crash_marker(self.layout, node).unlink(missing_ok=True)
        for name, pid in running.items():
            self.log.append(f"stopped {name} (pid {pid}){' with SIGKILL' if pid in killed else ''}")
            self.layout.pid_file(name).unlink(missing_ok=True)
        if not running:
            self.log.append("nothing was running")
        if self.chroot is not None:
            self._release_chroot()
        return sorted(running)

    def _release_chroot(self) -> None:
        assert self.chroot is not None
        try:
            self.chroot.release_unless_shared([self._program(n) for n in ("munged", "slurmctld", "slurmd")], self.log)
        except ChrootError as e:
            raise ClusterError(str(e)) from e

    def status(self) -> dict:
        """{"root", "conf", "daemons": {name: pid|None}, "nodes": {name: state}, "up": bool}."""
        daemons = self.pids()
        nodes: dict[str, str] = {}
        error = None
        if daemons.get("slurmctld") is not None:
            try:
                nodes = {n: s for n, s in self.node_states().items() if n in self.node_names}
            except ClusterError as e:
                error = str(e)
        up = all(pid is not None for pid in daemons.values()) and len(nodes) == len(self.node_names) and all(
            self.is_usable(s) for s in nodes.values())
        result = {"root": str(self.root), "conf": str(self.conf), "daemons": daemons, "nodes": nodes, "up": up}
        if error:
            result["error"] = error
        return result


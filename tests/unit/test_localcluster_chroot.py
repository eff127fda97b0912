"""Pure parts of the Slurm 24.11 / 26.05 chroot tooling (slurm/localcluster/chroot.py); the chroots themselves are
exercised by `make test-slurm24` and `make test-slurm26`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slurm.localcluster import ClusterError, LocalCluster, default_root
from slurm.localcluster.chroot import (
    MARKER,
    RELEASES,
    Chroot,
    ChrootError,
    cluster_binds,
    inside_path,
    interpreter_binds,
    is_under,
    mount_points,
    resolve_inside,
)

MOUNTINFO = """\
22 27 0:21 / /proc rw,relatime - proc proc rw
101 27 254:0 /tmp /var/cache/slurm-supervisor/trixie/tmp rw,relatime - ext4 /dev/vda rw
102 27 254:0 /work/a\\040b /var/cache/slurm-supervisor/trixie/work/a\\040b rw,relatime - ext4 /dev/vda rw
"""


def test_mount_points_unescape_spaces() -> None:
    assert mount_points(MOUNTINFO) == [
        Path("/proc"), Path("/var/cache/slurm-supervisor/trixie/tmp"), Path("/var/cache/slurm-supervisor/trixie/work/a b")]


def test_is_under_is_by_path_component() -> None:
    root = Path("/var/cache/x")
    assert is_under(Path("/var/cache/x/tmp"), root) and is_under(root, root)
    assert not is_under(Path("/var/cache/xy"), root)


def fake_rootfs(tmp_path: Path) -> Path:
    """Debian's layout: /usr/sbin/slurmd -> /etc/alternatives/slurmd -> /usr/sbin/slurmd-wlm (absolute links)."""
    root = tmp_path / "rootfs"
    (root / "usr/sbin").mkdir(parents=True)
    (root / "usr/bin").mkdir(parents=True)
    (root / "etc/alternatives").mkdir(parents=True)
    (root / "usr/sbin/slurmd-wlm").write_text("binary")
    os.symlink("/usr/sbin/slurmd-wlm", root / "etc/alternatives/slurmd")
    os.symlink("/etc/alternatives/slurmd", root / "usr/sbin/slurmd")
    (root / "usr/bin/squeue").write_text("binary")
    return root


def test_programs_resolve_inside_the_chroot_not_on_the_host(tmp_path: Path) -> None:
    root = fake_rootfs(tmp_path)
    assert inside_path(root, "slurmd", ["/usr/sbin", "/usr/bin"]) == "/usr/sbin/slurmd"
    assert resolve_inside(root, "/usr/sbin/slurmd") == root / "usr/sbin/slurmd-wlm"
    chroot = Chroot(root)
    assert chroot.program("slurmd") == root / "usr/sbin/slurmd-wlm"
    assert chroot.program("munged") is None
    assert not chroot.complete


def test_command_and_wrappers_pass_arguments_as_arguments(tmp_path: Path) -> None:
    root = fake_rootfs(tmp_path)
    chroot = Chroot(root)
    argv = chroot.command("slurmd", ["-N", "node1; rm -rf /"])
    assert argv[1:] == [str(root), "/usr/sbin/slurmd", "-N", "node1; rm -rf /"]
    bindir = chroot.write_wrappers(tmp_path / "bin")
    text = (bindir / "squeue").read_text()
    assert text.startswith("#!/bin/sh\n") and f"[ -e /{MARKER} ]" in text and '"$@"' in text
    assert not (bindir / "sbatch").exists()  # not installed in this rootfs: no wrapper


def test_wrapper_inside_the_chroot_runs_the_program_directly(tmp_path: Path) -> None:
    """The branch a job takes (marker present): emulated by pointing the marker test at a file that exists."""
    chroot = Chroot(fake_rootfs(tmp_path))
    text = (chroot.write_wrappers(tmp_path / "bin") / "squeue").read_text()
    script = tmp_path / "probe.sh"
    script.write_text(text.replace(f"/{MARKER}", str(script)).replace("/usr/bin/squeue", "/bin/echo"))
    out = subprocess.run(["/bin/sh", str(script), "a b", "$(x)"], capture_output=True, text=True, check=True)
    assert out.stdout == "a b $(x)\n"


def test_cluster_binds_add_the_cluster_root_only_outside_the_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "repo"
    assert cluster_binds(checkout, checkout / ".cluster-24") == [checkout, *interpreter_binds()]
    assert cluster_binds(checkout, Path("/srv/c24"))[-1] == Path("/srv/c24")


def test_slurm_choice_is_checked_and_picks_its_own_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUPERVISOR_CLUSTER_DIR", raising=False)
    assert default_root("24").name == ".cluster-24" and default_root().name == ".cluster"
    with pytest.raises(ClusterError, match="--slurm '23' is not supported"):
        LocalCluster("/nonexistent", slurm="23")
    assert LocalCluster("/nonexistent", slurm="system").chroot is None


def test_each_newer_slurm_has_its_own_chroot_and_names_itself_in_fixes(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:  # fmt: skip
    """24.11 (trixie) and 26.05 (sid) side by side: two chroots, two cluster roots, and a fix that names the right
    --slurm (a wrong one would reinstall the other release)."""
    monkeypatch.delenv("SUPERVISOR_CLUSTER_DIR", raising=False)
    for name in ("SUPERVISOR_SLURM_CHROOT", "SUPERVISOR_SLURM_CHROOT_24", "SUPERVISOR_SLURM_CHROOT_26"):
        monkeypatch.delenv(name, raising=False)
    assert Chroot().root.name == "trixie" and Chroot(debian=RELEASES["26"]).root.name == "sid"
    assert default_root("26").name == ".cluster-26"
    monkeypatch.setenv("SUPERVISOR_SLURM_CHROOT", str(tmp_path / "old"))  # the 24.11 variable, as before
    monkeypatch.setenv("SUPERVISOR_SLURM_CHROOT_26", str(tmp_path / "new"))
    assert Chroot().root == tmp_path / "old" and Chroot(debian=RELEASES["26"]).root == tmp_path / "new"
    with pytest.raises(ChrootError, match="--slurm 26"):
        Chroot(fake_rootfs(tmp_path), RELEASES["26"]).command("munged", [])
    cluster = LocalCluster(tmp_path / "c", slurm="26")
    if cluster.chroot is not None:  # (a Debian 14 host runs its own 26.05)
        assert cluster.chroot.debian.slurm == "26.05"
        with pytest.raises(ClusterError, match="--slurm 26"):
            LocalCluster(tmp_path / "c", slurm="26", accounting=True)


def test_cli_base_port_follows_the_env_var_the_tests_and_demo_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A second cluster started from the CLI with SUPERVISOR_CLUSTER_BASE_PORT set must not take the default ports
    (one engineer's `up` once landed on another's cluster)."""
    from slurm.localcluster.__main__ import build_parser
    from slurm.localcluster.config import DEFAULT_BASE_PORT

    monkeypatch.delenv("SUPERVISOR_CLUSTER_BASE_PORT", raising=False)
    assert build_parser().parse_args(["up"]).base_port == DEFAULT_BASE_PORT
    monkeypatch.setenv("SUPERVISOR_CLUSTER_BASE_PORT", "17030")
    assert build_parser().parse_args(["up"]).base_port == 17030
    assert build_parser().parse_args(["up", "--base-port", "17050"]).base_port == 17050
    monkeypatch.setenv("SUPERVISOR_CLUSTER_BASE_PORT", "x")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["up"])

"""Every training launch gets torch's env:// variables (and torchrun's defaults), the user's own win, and the
per-task shim keeps the user's argv out of shell text."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from slurm import srun
from supervisor.driver import distenv


def test_a_launch_gets_master_world_and_torchrun_defaults() -> None:
    d = distenv.plan(("n3", "n4"), 2, {"n3": "10.0.0.3", "n4": "10.0.0.4"}, 23456, {}, "7-0-1")
    assert d.env == {
        "MASTER_ADDR": "10.0.0.3", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2",
        "PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "10.0.0.3:23456", "PET_RDZV_ID": "7-0-1",
        "PET_NNODES": "2", "PET_MAX_RESTARTS": "0",
    }  # fmt: skip
    assert d.per_task == ("RANK", "LOCAL_RANK", "NODE_RANK")


def test_an_unknown_address_is_the_node_name_and_ipv6_is_bracketed_for_the_endpoint() -> None:
    assert distenv.plan(("gpu7",), 1, {}, 20000, {}, "x").env["MASTER_ADDR"] == "gpu7"
    assert distenv.plan(("a",), 1, {"a": "fd00::1"}, 20000, {}, "x").env["PET_RDZV_ENDPOINT"] == "[fd00::1]:20000"


def test_what_the_user_set_is_never_overridden() -> None:
    user = {"MASTER_ADDR": "head", "MASTER_PORT": "29500", "RANK": "0", "PET_MAX_RESTARTS": "3"}
    d = distenv.plan(("n1", "n2"), 1, {"n1": "10.0.0.1"}, 23456, user, "r")
    assert not set(user) & set(d.env)
    assert d.env["PET_RDZV_ENDPOINT"] == "head:29500"  # torchrun meets where the user's master is
    assert d.per_task == ("LOCAL_RANK", "NODE_RANK")


def test_an_empty_launch_is_refused() -> None:
    with pytest.raises(ValueError):
        distenv.plan((), 1, {}, 1, {}, "r")


def test_the_shim_exports_srun_layout_and_passes_argv_untouched(tmp_path: Path) -> None:
    """Arguments with spaces, quotes, $(...), ; and newlines reach the program as they are; RANK and friends
    come from srun's variables; the program keeps the shim's pid (exec)."""
    nasty = ["a b", "'q'", '"d"', "$(touch x)", "; rm -rf /", "line\nbreak", "$SLURM_PROCID", ""]
    code = ("import json, os, sys; print(json.dumps({'argv': sys.argv[1:], 'pid': os.getpid(), "
            "'env': {k: os.environ.get(k) for k in ('RANK', 'LOCAL_RANK', 'NODE_RANK')}}))")
    argv = distenv.shim(("RANK", "LOCAL_RANK", "NODE_RANK"), [sys.executable, "-c", code, *nasty])
    assert argv[:2] == ["/bin/sh", "-c"] and "$(touch" not in argv[2]
    env = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NODEID": "2", "PATH": "/usr/bin:/bin"}
    proc = subprocess.Popen(argv, env=env, cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    out = json.loads(proc.communicate(timeout=30)[0])
    assert out["argv"] == nasty
    assert out["env"] == {"RANK": "5", "LOCAL_RANK": "1", "NODE_RANK": "2"}
    assert out["pid"] == proc.pid
    assert not (tmp_path / "x").exists()


def _run_shim(argv: list[str], env: dict[str, str]) -> dict[str, str]:
    code = "import json, os; print(json.dumps({k: os.environ.get(k) for k in ('RANK', 'NODE_RANK', 'PET_NODE_RANK')}))"
    out = subprocess.run([*argv, sys.executable, "-c", code], env={**env, "PATH": "/usr/bin:/bin"}, text=True,
                         stdout=subprocess.PIPE, check=True, timeout=30).stdout  # fmt: skip
    return json.loads(out)


def test_moved_ranks_get_the_node_rank_of_the_hostfile_not_slurms_node_order() -> None:
    """Ranks moved by one node (rank 0 on n3): SLURM_HOSTFILE puts ranks 0,1 on n3 and 2,3 on n1, but Slurm
    numbers the step's nodes in its own order (n1 = SLURM_NODEID 0). NODE_RANK (and torchrun's --node-rank,
    for its static rendezvous) must follow the hostfile, as RANK // LOCAL_WORLD_SIZE, so node rank 0 is
    MASTER_ADDR's node."""
    nodes, tpn = ("n3", "n1"), 2
    hostfile = srun.hostfile_text(nodes, tpn).split()
    d = distenv.plan(nodes, tpn, {"n3": "10.0.0.3", "n1": "10.0.0.1"}, 23456, {}, "r", placed=True, node_rank_flag=True)
    assert d.env["MASTER_ADDR"] == "10.0.0.3"
    slurm_node_id = {n: i for i, n in enumerate(sorted(nodes))}  # what srun sets: n1 -> 0, n3 -> 1
    for rank, node in enumerate(hostfile):
        env = _run_shim(d.wrap([]), {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank % tpn),
                                     "SLURM_NODEID": str(slurm_node_id[node])})  # fmt: skip
        assert env["RANK"] == str(rank)
        assert env["NODE_RANK"] == env["PET_NODE_RANK"] == str(nodes.index(node)) == str(rank // tpn)


def test_in_place_ranks_keep_srun_node_id_and_torchrun_node_rank_only_for_the_static_rendezvous() -> None:
    plain = distenv.plan(("n1", "n2"), 1, {}, 23456, {}, "r")
    assert plain.placed == 0 and "PET_NODE_RANK" not in plain.per_task  # c10d ignores --node-rank (and warns)
    env = _run_shim(plain.wrap([]), {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"})
    assert (env["NODE_RANK"], env["PET_NODE_RANK"]) == ("1", None)
    static = distenv.plan(("n1", "n2"), 1, {}, 23456, {}, "r", node_rank_flag=True)
    assert _run_shim(static.wrap([]), {"SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_NODEID": "1"}
                     )["PET_NODE_RANK"] == "1"  # fmt: skip
    user = distenv.plan(("n1", "n2"), 1, {}, 23456, {"PET_NODE_RANK": "0"}, "r", node_rank_flag=True)
    assert "PET_NODE_RANK" not in user.per_task


@pytest.mark.parametrize(("command", "user", "static"), [
    (["torchrun", "--rdzv-backend=static", "t.py"], {}, True),
    (["torchrun", "--rdzv_backend", "static", "t.py"], {}, True),
    (["torchrun", "--nproc-per-node=2", "t.py"], {"PET_RDZV_BACKEND": "static"}, True),
    (["torchrun", "--rdzv-backend=c10d", "t.py"], {}, False),
    (["torchrun", "t.py", "--rdzv-backend"], {}, False),
    (["python", "t.py"], {}, False),
])  # fmt: skip
def test_static_rendezvous_is_read_from_torchruns_flag_or_the_users_environment(command, user, static) -> None:
    assert distenv.static_rendezvous(command, user) is static


@pytest.mark.parametrize(("command", "user", "on"), [
    (["torchrun", "--nproc-per-node=2", "t.py"], {}, False),  # the supervisor's PET_MAX_RESTARTS=0
    (["torchrun", "--max-restarts=2", "t.py"], {}, True),
    (["python", "-m", "torch.distributed.run", "--max_restarts", "1", "t.py"], {}, True),
    (["torchrun", "--max-restarts=0", "t.py"], {"PET_MAX_RESTARTS": "3"}, False),  # the flag wins
    (["torchrun", "t.py"], {"PET_MAX_RESTARTS": "3"}, True),
    (["torchrun", "t.py", "--max-restarts=5"], {}, False),  # the script's own argument
    (["python", "t.py", "--max-restarts=5"], {}, False),  # not torchrun
])  # fmt: skip
def test_torchruns_own_restarts_are_read_from_its_flag_or_the_users_environment(command, user, on) -> None:
    assert distenv.torchrun_restarts_on(command, user) is on


def test_no_shim_when_the_user_set_every_per_task_variable() -> None:
    assert distenv.shim((), ["python", "train.py"]) == ["python", "train.py"]


def test_choose_port_skips_earlier_launches_and_busy_ports() -> None:
    assert distenv.choose_port([1, 2, 3, 4], lambda p: p != 2, avoid=[1]) == 3
    assert distenv.choose_port([5, 6], lambda p: False, avoid=[5]) == 6  # nothing probes free: first not avoided
    with pytest.raises(ValueError):
        distenv.choose_port([7], lambda p: True, avoid=[7])


def test_pick_port_on_this_host_never_returns_a_bound_port() -> None:
    first = next(distenv.candidates(random.Random(42)))
    with socket.socket() as held:
        try:
            held.bind(("", first))
        except OSError:
            pytest.skip(f"port {first} is taken on this host already")
        held.listen()
        port = distenv.pick_port("127.0.0.1", rng=random.Random(42))
    assert port != first and distenv.PORT_LOW <= port <= distenv.PORT_HIGH
    assert distenv.pick_port("127.0.0.1", avoid=[port], rng=random.Random(42)) != port


def test_a_port_in_time_wait_counts_as_taken() -> None:
    """The reason a relaunch needs a fresh port: the old store's connections linger in TIME_WAIT."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        cli = socket.create_connection(("127.0.0.1", port))
        conn, _ = srv.accept()
        conn.close()  # the server side closes first: its end goes to TIME_WAIT
        cli.close()
    assert not distenv.port_free(port)


def test_is_local() -> None:
    assert distenv.is_local("127.0.0.1") and distenv.is_local("localhost")
    assert not distenv.is_local("192.0.2.1")  # TEST-NET-1: never an address of this host

"""Standby ranks: the rule (how many per node, when, which takes which dead rank; property-tested), the setting,
the standby's srun line and command, and the driver with in-process fakes: a pool started only once the launch
trains and topped up after a takeover, dead standbys dropped and given up on after a few, idle ones cancelled, and
a warm restart handing a dead rank to its node's standby (its assignment sent, and again until the rank shows up)
instead of starting a new step."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fakes import FakeChannel, FakeProcess
from hypothesis import given
from hypothesis import strategies as st
from test_warm_restart_driver import Recorded, launch_of, trainer

from slurm import srun
from supervisor import procstate
from supervisor.client.layout import RANK_FLAG_AWAITING_RESTART, RANK_FLAG_RESTARTABLE
from supervisor.client.restart_order import ASSIGN_ENV, RestartOrder
from supervisor.config import ConfigError, from_mapping
from supervisor.decisions import standbys as rule
from supervisor.decisions import warm_restart as warm_rule
from supervisor.driver import distenv, torchrun_worker
from supervisor.driver.context import Context
from supervisor.driver.launcher import Launch
from supervisor.driver.standbys import MAX_DEAD, Standbys
from supervisor.driver.warm_restart import WarmRestarts
from supervisor.heartbeat.orders import parse_orders
from supervisor.heartbeat.table import RankView

NODES = ("n0", "n1", "n2")


def test_per_node_follows_the_setting_and_only_for_warm_plain_python_launches() -> None:
    assert rule.per_node("auto", warm=True, plain_python=True) == 1
    assert rule.per_node(3, warm=True, plain_python=True) == 3
    assert rule.per_node("off", warm=True, plain_python=True) == 0
    assert rule.per_node("auto", warm=False, plain_python=True) == 0, "a cold launch: nothing would take them"
    assert rule.per_node("auto", warm=True, plain_python=False) == 0, "a wrapper script cannot be taken over"
    # under torchrun a dead worker's node-mates are started again with it: "auto" keeps a standby for each
    assert rule.per_node("auto", warm=True, plain_python=True, together=4) == 4
    assert rule.per_node(1, warm=True, plain_python=True, together=4) == 1, "a number given is kept"


@given(st.lists(st.sampled_from(NODES), max_size=6), st.integers(0, 3), st.booleans())
def test_to_start_fills_each_node_up_to_per_node_and_only_while_training(idle_nodes: list[str], per_node: int,
                                                                         training: bool) -> None:  # fmt: skip
    idle = {n: idle_nodes.count(n) for n in NODES}
    want = rule.wanted(NODES[:2], NODES[2:], per_node=per_node, tasks_per_node=2)
    started = rule.to_start(want, idle, training=training)
    if not training:
        assert started == []
    for node in NODES:
        goal = want.get(node, 0) if training else idle[node]
        assert idle[node] + started.count(node) == max(idle[node], goal)


def test_a_spare_node_keeps_enough_standbys_for_a_whole_lost_nodes_ranks() -> None:
    assert rule.wanted(("n0", "n1"), ("n2",), per_node=1, tasks_per_node=4) == {"n0": 1, "n1": 1, "n2": 4}
    assert rule.wanted(("n0",), ("n2",), per_node=0, tasks_per_node=4) == {}


@given(st.dictionaries(st.integers(0, 7), st.sampled_from(NODES), max_size=8),
       st.dictionaries(st.sampled_from(NODES), st.lists(st.text("abc123", min_size=1, max_size=3), unique=True,
                                                        max_size=3), max_size=3))  # fmt: skip
def test_assign_gives_each_dead_rank_at_most_one_standby_of_its_own_node(dead: dict[int, str],
                                                                        idle: dict[str, list[str]]) -> None:  # fmt: skip
    idle = {node: [f"{node}-{i}" for i in ids] for node, ids in idle.items()}  # ids unique across nodes
    out = rule.assign(dead, idle)
    assert len(set(out.values())) == len(out), "a standby took two ranks"
    for rank, ident in out.items():
        assert ident in idle[dead[rank]], "a standby took a rank of another node"
    for node in NODES:
        wanting = sorted(r for r, n in dead.items() if n == node)
        assert len([r for r in wanting if r in out]) == min(len(wanting), len(idle.get(node, ()))), "one left idle"


def test_assign_takes_the_oldest_standby_first() -> None:
    assert rule.assign({4: "n1", 1: "n1"}, {"n1": ["7", "9", "12"]}) == {1: "7", 4: "9"}


def test_the_setting_is_checked() -> None:
    assert from_mapping({"run": {"standbys": 2}}).run.standbys == 2
    assert from_mapping({}).run.standbys == "auto"
    for bad in ("always", -1, 65, 1.5, True):
        with pytest.raises(ConfigError, match="run.standbys"):
            from_mapping({"run": {"standbys": bad}})


def test_the_standby_command_and_srun_line() -> None:
    assert distenv.standby_command(["python3", "train.py", "--x", "1"]) == \
        ["python3", "-m", "supervisor.client.standby", "--", "train.py", "--x", "1"]  # fmt: skip
    assert distenv.standby_command(["/v/bin/python", "-m", "pkg.train"])[-3:] == ["--", "-m", "pkg.train"]
    for other in (["python", "-u", "train.py"], ["bash", "run.sh"], ["torchrun", "t.py"], ["python"]):
        assert distenv.standby_command(other) is None, other
    # torchrun's worker (driver/torchrun_worker.py): its interpreter, unbuffered, the script or module and its args
    assert torchrun_worker.standby_command(["/v/bin/python3", "-u", "train.py", "--x", "1"]) == \
        ["/v/bin/python3", "-u", "-m", "supervisor.client.standby", "--", "train.py", "--x", "1"]  # fmt: skip
    assert torchrun_worker.standby_command(["/v/bin/python", "-u", "-m", "pkg.train"])[-3:] == ["--", "-m", "pkg.train"]
    assert torchrun_worker.standby_command(["./train_bin", "--x"]) is None  # --no-python: not a Python program
    argv = srun.standby(["python", "x"], launch=3, standby="7", node="n1", extra=("--gpus-per-task=1",))
    assert argv[:2] == ["srun", "--overlap"] and "--job-name=train-3-standby-7" in argv and "--nodelist=n1" in argv
    assert "--ntasks=1" in argv and argv[-3:] == ["--gpus-per-task=1", "python", "x"]


class StepSlurm:
    """Knows the steps the test started by name; cancelling one kills its process."""

    def __init__(self) -> None:
        self.steps: dict[str, FakeProcess] = {}
        self.cancelled: list[str] = []

    def step_ids(self, job_id: str) -> dict[str, str]:
        return {name: name for name, proc in self.steps.items() if proc.returncode is None}

    def cancel_step(self, step_id: str, sig: str = "KILL") -> None:
        self.cancelled.append(step_id)
        self.steps[step_id].kill()


def beating(rank: int, *, beats: int = 3, flags: int = RANK_FLAG_RESTARTABLE, pid: int = 0) -> RankView:
    return RankView(rank, NODES[rank], pid=pid or 100 + rank, state=procstate.RUNNING, rank_flags=flags, beats=beats)


def pool(tmp_path: Path, ranks: list[RankView], setting: str | int = "auto",
         command: tuple[str, ...] = ("python", "train.py"), worker: tuple[list[str], int] | None = None,
         spares: tuple[str, ...] = ()) -> tuple[Standbys, StepSlurm, list[Any], Recorded]:  # fmt: skip
    started: list[tuple[list[str], dict[str, str]]] = []
    slurm, record = StepSlurm(), Recorded()
    t = trainer(tmp_path, started)
    plain_start = t.start

    def start(argv: Any, env: Any, log_path: Path, cwd: str | None = None) -> Any:
        proc = plain_start(argv, env, log_path, cwd)
        slurm.steps[next(a for a in argv if a.startswith("--job-name=")).split("=", 1)[1]] = proc
        return proc

    t.start = start
    if worker is not None:  # under torchrun: its worker command and workers per node (the launcher reads them)
        t.torchrun_worker = worker
    s = Standbys(Context.of(record), setting=setting, command=command, trainer=t, slurm=slurm, job_id="7",  # type: ignore[arg-type]
                 ranks_of=lambda launch: ranks, tasks_per_node=worker[1] if worker else 1,
                 spares_of=lambda launch: spares)  # fmt: skip
    return s, slurm, started, record


def test_standbys_start_once_every_rank_trains_one_per_node_journaled(tmp_path: Path) -> None:
    ranks = [beating(0), beating(1, beats=0), beating(2)]
    s, _, started, record = pool(tmp_path, ranks)
    launch = launch_of(tmp_path)
    s.keep(launch)
    assert started == [], "rank 1 has not stepped yet: a standby's imports would slow the launch's start"
    ranks[1] = beating(1)
    s.keep(launch)
    assert [next(a for a in argv if a.startswith("--nodelist=")) for argv, _ in started] == \
        ["--nodelist=n0", "--nodelist=n1", "--nodelist=n2"]  # fmt: skip
    argv, env = started[0]
    assert argv[-5:] == ["python", "-m", "supervisor.client.standby", "--", "train.py"]
    assert env["SUPERVISOR_STANDBY"] == "1" and env["SUPERVISOR_HELPER_STEP"] == "standby"
    assert env["SUPERVISOR_WARM_RESTART"] == "1" and env["RANK"] == "9", "no rank until assigned (the user's own RANK)"
    assert record.events[-1]["type"] == "standbys" and record.events[-1]["started"] == {"1": "n0", "2": "n1", "3": "n2"}
    s.keep(launch)
    assert len(started) == 3, "the pool is full: nothing more started"


def test_under_torchrun_each_node_keeps_a_standby_per_worker_running_torchruns_worker_and_none_on_spares(
        tmp_path: Path) -> None:  # fmt: skip
    """A dead worker's torchrun stops its node-mates: the node's every rank is started again, so "auto" keeps one
    standby per worker (one alone would leave the others paying the start); a lost node's torchrun never moves
    warm (the restart is cold), so a spare keeps none."""
    command = ("/v/bin/python", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py", "--x", "1")
    worker = torchrun_worker.worker_command(command, {})
    assert worker == (["/v/bin/python", "-u", "train.py", "--x", "1"], 2)
    ranks = [RankView(r, NODES[r // 2], pid=100 + r, state=procstate.RUNNING, rank_flags=RANK_FLAG_RESTARTABLE,
                      beats=3) for r in range(6)]  # fmt: skip
    s, _, started, record = pool(tmp_path, ranks, command=command, worker=worker, spares=("n3",))
    s.keep(launch_of(tmp_path))
    assert sorted(next(a for a in argv if a.startswith("--nodelist=")) for argv, _ in started) == \
        ["--nodelist=n0", "--nodelist=n0", "--nodelist=n1", "--nodelist=n1", "--nodelist=n2", "--nodelist=n2"]
    assert started[0][0][-8:] == ["/v/bin/python", "-u", "-m", "supervisor.client.standby", "--", "train.py", "--x", "1"]
    assert len(record.events) == 1 and len(record.events[0]["started"]) == 6
    s2 = pool(tmp_path, ranks, command=("torchrun", "--no-python", "--nproc-per-node=2", "./a"), worker=(["./a"], 2))
    s2[0].keep(launch_of(tmp_path))
    assert s2[2] == [] and "torchrun" in s2[3].events[0]["why"], "not a Python program: no standby can run it"


def test_a_waiting_rank_means_not_training(tmp_path: Path) -> None:
    ranks = [beating(0), beating(1, flags=RANK_FLAG_RESTARTABLE | RANK_FLAG_AWAITING_RESTART), beating(2)]
    s, _, started, _ = pool(tmp_path, ranks)
    s.keep(launch_of(tmp_path))
    assert started == []


def test_no_standbys_for_a_cold_launch_off_or_a_wrapper_which_is_journaled_once(tmp_path: Path) -> None:
    ranks = [beating(r) for r in range(3)]
    for setting, command, warm in (("off", ("python", "t.py"), True), ("auto", ("python", "t.py"), False)):
        s, _, started, record = pool(tmp_path, ranks, setting, command)
        s.keep(launch_of(tmp_path, warm=warm))
        assert started == [] and record.events == []
    s, _, started, record = pool(tmp_path, ranks, "auto", ("bash", "run.sh"))
    launch = launch_of(tmp_path)
    s.keep(launch)
    s.keep(launch)
    assert started == [] and len(record.events) == 1 and "python SCRIPT" in record.events[0]["why"]


def test_dead_standbys_are_replaced_until_too_many_died(tmp_path: Path) -> None:
    s, _, started, record = pool(tmp_path, [beating(r) for r in range(3)], setting=1)
    launch = launch_of(tmp_path)
    s.keep(launch)
    for _ in range(MAX_DEAD):
        s.idle[0].proc.kill()
        s.keep(launch)
    assert len(started) == 3 + MAX_DEAD - 1, "the last death stopped the pool from being topped up"
    assert "ended unassigned" in record.events[-1]["why"]


def test_take_gives_the_dead_ranks_nodes_standby_and_the_pool_is_topped_up_later(tmp_path: Path) -> None:
    ranks = [beating(r) for r in range(3)]
    s, _, started, _ = pool(tmp_path, ranks)
    launch = launch_of(tmp_path)
    s.keep(launch)
    taken = s.take(launch, {1: "n1"})
    assert list(taken) == [1] and taken[1].node == "n1" and taken[1].ident == "2"
    assert s.take(launch, {1: "n1"}) == {}, "n1's only standby is taken"
    assert s.take(launch_of(tmp_path), {0: "n0"}) == {}, "another launch's pool is not this one's"
    s.keep(launch)
    assert len(started) == 4 and "--nodelist=n1" in started[-1][0]


def test_retire_cancels_the_idle_standbys_steps(tmp_path: Path) -> None:
    s, slurm, _, _ = pool(tmp_path, [beating(r) for r in range(3)])
    launch = launch_of(tmp_path)
    s.keep(launch)
    taken = s.take(launch, {0: "n0"})
    s.retire()
    assert sorted(slurm.cancelled) == ["train-1-standby-2", "train-1-standby-3"]
    assert taken[0].proc.poll() is None, "the standby that became rank 0 is the launch's now"
    assert s.idle == [] and s.take(launch, {1: "n1"}) == {}


def test_a_warm_restart_hands_the_dead_rank_to_its_nodes_standby(tmp_path: Path) -> None:
    waiting = RANK_FLAG_RESTARTABLE | RANK_FLAG_AWAITING_RESTART
    started: list[Any] = []
    channel, record = FakeChannel("7"), Recorded()
    channel.table.ranks = [beating(0, flags=waiting), beating(2, flags=waiting)]
    t = trainer(tmp_path, started)
    w = WarmRestarts(Context.of(record), mode="on", command=("python", "t.py"), channel=channel, trainer=t,
                     ranks_of=lambda launch: list(channel.table.ranks), tasks_per_node=1)  # fmt: skip
    launch = launch_of(tmp_path)
    standby = t.start_standby(launch, "n1", "5", ["python", "-m", "supervisor.client.standby", "--", "t.py"])
    started.clear()

    def take_it_later() -> None:  # the survivors read the order at once; the standby's rank shows up after resends
        channel.table.ranks = [beating(0), beating(2)]
        time.sleep(1.2)
        channel.table.ranks = [beating(0), beating(2), beating(1, pid=555, beats=0)]

    helper = threading.Thread(target=take_it_later)
    helper.start()
    _, untaken = w.restart(launch, warm_rule.WarmChoice(warm_rule.WARM, (1,)), RestartOrder(1, {"MASTER_PORT": "23456"}),
                           {1: standby})  # fmt: skip
    assert untaken == ()
    helper.join()
    assert started == [], "the rank was not started as a new step: its node's standby took it"
    assigns = [(node, parse_orders(text).assign) for node, text in channel.orders if '"assign"' in text]
    assert len(assigns) > 1 and {node for node, _ in assigns} == {"n1"}, "the assignment was not sent again"
    ident, order = assigns[0][1]
    assert ident == "5" and order.generation == 1 and set(order.env) <= ASSIGN_ENV
    assert (order.env["MASTER_PORT"], order.env["LOCAL_RANK"], order.env["NODE_RANK"]) == ("23456", "0", "1")
    assert "RANK" not in order.env, "the user's own RANK for every rank is not overridden"
    assert launch.names == ("train-1", "train-1-standby-5") and launch.replaced[0].rank == 1
    assert json.loads(channel.orders[0][1])["restart"]["generation"] == 1


def test_under_torchrun_a_standbys_assignment_carries_torchruns_worker_variables_and_the_client_takes_it(
        tmp_path: Path) -> None:  # fmt: skip
    """Found on Slurm: the assignment's torchrun worker variables (GROUP_RANK, ROLE_RANK, ...) were outside the
    client's allowlist, the node's agent refused the order, the standby never took its rank and the kept workers
    waited out the rendezvous (120 s)."""
    from supervisor.client.restart_order import encode_order, parse_order

    t = trainer(tmp_path, [])
    t.torchrun_worker = (["/v/bin/python", "-u", "train.py"], 2)
    launch = Launch(1, "train-1", FakeProcess(), tmp_path / "l.log", 0.0, NODES, warm=True)
    order = t.assignment(launch, RestartOrder(1, {"MASTER_PORT": "23456", "TORCHELASTIC_USE_AGENT_STORE": "False"}),
                         3)  # fmt: skip
    assert set(order.env) <= ASSIGN_ENV, set(order.env) - ASSIGN_ENV
    assert (order.env["RANK"], order.env["LOCAL_RANK"], order.env["GROUP_RANK"], order.env["WORLD_SIZE"]) == \
        ("3", "1", "1", "6")  # fmt: skip
    assert parse_order(encode_order(order, ASSIGN_ENV), ASSIGN_ENV) == order


def test_a_standby_launch_number_in_the_step_name_and_as_rank(tmp_path: Path) -> None:
    t = trainer(tmp_path, [])
    launch = Launch(4, "train-4", FakeProcess(), tmp_path / "l.log", 0.0, NODES, warm=True)
    standby = t.start_standby(launch, "n2", "9", ["python", "x"])
    rep = standby.as_rank(2, 3)
    assert (rep.rank, rep.node, rep.generation, rep.name) == (2, "n2", 3, "train-4-standby-9")

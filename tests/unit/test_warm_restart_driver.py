"""Warm restart's driver parts with in-process fakes: which launches are warm, when the rule is asked and what a
cold answer journals, the order sent to every node and repeated until the waiting ranks took it, the ranks started
again with their own identity, the launch's sruns seen as one, its log read from the restart on, the launch's end
judged from its ranks when srun reports the rank that was replaced, and the agent finding a rank started again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fakes import FakeChannel, FakeProcess

from supervisor import procstate
from supervisor.agent.discover import find_ranks
from supervisor.client.layout import (
    RANK_FLAG_AWAITING_RESTART,
    RANK_FLAG_RESTARTABLE,
    RANK_FLAG_RETURNED,
)
from supervisor.client.restart_order import RestartOrder
from supervisor.decisions import policy
from supervisor.decisions import warm_restart as rule
from supervisor.decisions.classify import Interruption
from supervisor.decisions.placement import TrainingLayout
from supervisor.driver.context import Context
from supervisor.driver.launch_log import LaunchLog
from supervisor.driver.launcher import Launch, LaunchProcs, TrainingLauncher
from supervisor.driver.warm_restart import WarmRestarts
from supervisor.driver.watch import Watcher
from supervisor.heartbeat.table import RankView

RESTARTING = RANK_FLAG_RESTARTABLE | RANK_FLAG_AWAITING_RESTART


def view(rank: int, *, alive: bool = True, flags: int = RESTARTING, pid: int = 0, beats: int = 5) -> RankView:
    return RankView(rank, f"n{rank}", pid=pid or 100 + rank, state=procstate.RUNNING if alive else procstate.GONE,
                    rank_flags=flags, beats=beats)  # fmt: skip


def restart_decision(cls: str = "unknown") -> tuple[Interruption, policy.Decision]:
    actions = (policy.Action(policy.ALERT, "L2"), policy.Action(policy.KILL_STEP),
               policy.Action(policy.RESTART_IN_ALLOCATION, params={"exclude": [], "nodes": ["n0", "n1", "n2"]}))  # fmt: skip
    return Interruption(cls, (), 0.6, ("rank 1 was killed",)), policy.Decision(actions, "running", "relaunch")


def launch_of(tmp_path: Path, warm: bool = True) -> Launch:
    return Launch(1, "train-1", FakeProcess(), tmp_path / "train-1.log", time.monotonic(), ("n0", "n1", "n2"), warm=warm)


class Recorded:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def __call__(self, event: dict[str, Any]) -> None:
        self.events.append(event)


def trainer(tmp_path: Path, started: list[tuple[list[str], dict[str, str]]]) -> TrainingLauncher:
    def start(argv: Any, env: Any, log_path: Path, cwd: str | None = None) -> FakeProcess:
        started.append((list(argv), dict(env)))
        return FakeProcess()

    return TrainingLauncher(Context.of(lambda e: None), start=start, layout=TrainingLayout(("n0", "n1", "n2"), 1),
                            command=("python", "train.py"), cwd=None, srun_args=(), job_id="7", restart_count=0,
                            campaign=Path("/c"), log_dir=tmp_path, node_addresses={"n0": "10.0.0.1"},
                            checkpoint_dir_known=True, environ={"RANK": "9", "PATH": "/bin"})  # fmt: skip


def warm_restarts(tmp_path: Path, ranks: list[RankView], mode: str = "on", command: tuple[str, ...] = ("python", "t.py"),
                  started: list[Any] | None = None) -> tuple[WarmRestarts, FakeChannel, Recorded]:  # fmt: skip
    channel, record = FakeChannel("7"), Recorded()
    channel.table.ranks = ranks
    w = WarmRestarts(Context.of(record), mode=mode, command=command, channel=channel,
                     trainer=trainer(tmp_path, started if started is not None else []),
                     ranks_of=lambda launch: list(channel.table.ranks), tasks_per_node=1, release_deadline_s=0.3)  # fmt: skip
    return w, channel, record


def test_which_launches_are_warm(tmp_path: Path) -> None:
    assert warm_restarts(tmp_path, [], mode="on")[0].next_launch_warm()
    assert not warm_restarts(tmp_path, [], mode="off")[0].next_launch_warm()
    assert not warm_restarts(tmp_path, [], mode="on", command=("torchrun", "t.py"))[0].next_launch_warm()
    auto, channel, _ = warm_restarts(tmp_path, [view(0), view(1)], mode="auto")
    assert not auto.next_launch_warm()  # nothing seen yet: the first launch is cold
    auto.saw(launch_of(tmp_path, warm=False))
    assert not auto.next_launch_warm(), "rank 2 was never seen: not every rank is known to restart in place"
    channel.table.ranks = [view(0), view(1), view(2, flags=0)]
    auto.saw(launch_of(tmp_path, warm=False))
    assert not auto.next_launch_warm()
    channel.table.ranks = [view(r, flags=RANK_FLAG_RESTARTABLE) for r in range(3)]
    auto.saw(launch_of(tmp_path, warm=False))
    assert auto.next_launch_warm()


def test_a_killed_rank_on_a_warm_launch_is_chosen_warm_and_the_decision_keeps_its_alert(tmp_path: Path) -> None:
    w, _, record = warm_restarts(tmp_path, [view(0), view(1, alive=False), view(2)])
    interruption, decision = restart_decision()
    kill = w.plan(launch_of(tmp_path), interruption, decision, ())
    assert kill == ()
    warm = rule.as_warm(decision, kill)
    assert [a.kind for a in warm.actions] == [policy.ALERT, policy.WARM_RESTART]
    choice = w.choose(launch_of(tmp_path), interruption)
    assert choice.kind == rule.WARM and choice.replace == (1,) and not record.events
    assert w.plan(launch_of(tmp_path, warm=False), interruption, decision, ()) is None  # a cold launch: as before
    left_out = policy.Action(policy.RESTART_IN_ALLOCATION, params={"exclude": ["n9"], "nodes": ["n0", "n1", "n2"]})
    earlier = policy.Decision((*decision.actions[:2], left_out), "running", "relaunch")
    assert w.plan(launch_of(tmp_path), interruption, earlier, ()) == (), "a node the ledger left out long ago"
    moved = policy.Decision((*decision.actions[:2], policy.Action(policy.RESTART_IN_ALLOCATION,
                                                                  params={"exclude": ["n1"]})), "running", "")  # fmt: skip
    assert w.plan(launch_of(tmp_path), interruption, moved, ()) is None, "rank 1's node left out: ranks move"


def test_a_hangs_warm_restart_kills_the_hung_rank_alone_and_a_stall_of_everyone_is_cold(tmp_path: Path) -> None:
    from supervisor.decisions.detect import GLOBAL_STALL, RANK_STOPPED, DetectionEvent

    w, _, _ = warm_restarts(tmp_path, [view(0), view(1, flags=RANK_FLAG_RESTARTABLE), view(2)])
    interruption, decision = restart_decision("hang")
    stopped = DetectionEvent(RANK_STOPPED, ranks=(1,), nodes=("n1",))
    kill = w.plan(launch_of(tmp_path), interruption, decision, (stopped,))
    assert kill == (1,)
    warm = rule.as_warm(decision, kill)
    assert [(a.kind, a.target) for a in warm.actions][1:] == [(policy.KILL_RANKS, ("1",)), (policy.WARM_RESTART, ())]
    stall = DetectionEvent(GLOBAL_STALL, ranks=(0, 1, 2), nodes=("n0", "n1", "n2"))
    assert w.plan(launch_of(tmp_path), interruption, decision, (stall,)) is None


def test_a_survivor_that_does_not_let_go_in_time_makes_it_cold_and_journals_why(tmp_path: Path) -> None:
    w, _, record = warm_restarts(tmp_path, [view(0), view(1, alive=False), view(2, flags=RANK_FLAG_RESTARTABLE)])
    started = time.monotonic()
    choice = w.choose(launch_of(tmp_path), restart_decision()[0])
    assert choice.kind == rule.COLD and time.monotonic() - started >= 0.3
    assert record.events[-1]["type"] == "warm_restart_skipped" and "rank 2 did not let go" in record.events[-1]["why"]


def test_a_kept_rank_that_never_takes_its_order_is_returned_for_a_cold_fallback(tmp_path: Path,
                                                                                monkeypatch: Any) -> None:  # fmt: skip
    from supervisor.driver import warm_restart as driver

    monkeypatch.setattr(driver, "ORDER_TAKEN_WAIT_S", 1.0)
    w, channel, _ = warm_restarts(tmp_path, [view(0), view(1, alive=False), view(2)])

    def rank_0_takes_it() -> None:
        time.sleep(0.3)
        channel.table.ranks = [view(0, flags=RANK_FLAG_RESTARTABLE), view(2)]

    import threading

    helper = threading.Thread(target=rank_0_takes_it)
    helper.start()
    started = time.monotonic()
    _, untaken = w.restart(launch_of(tmp_path), rule.WarmChoice(rule.WARM, (1,)), RestartOrder(1, {}))
    helper.join()
    assert untaken == (2,) and time.monotonic() - started >= 1.0
    assert [n for n, _ in channel.orders].count("n2") > 1, "the order was not sent again to the rank still waiting"


def test_a_second_fault_before_the_restarted_generation_trained_is_cold(tmp_path: Path) -> None:
    w, channel, _ = warm_restarts(tmp_path, [view(0), view(1, alive=False), view(2)])
    launch = launch_of(tmp_path)
    w.restart(launch, rule.WarmChoice(rule.WARM, (1,)), RestartOrder(1, {"MASTER_PORT": "1"}))
    channel.table.ranks = [view(0), view(1, pid=555, beats=0), view(2, alive=False)]  # rank 1 never stepped
    choice = w.choose(launch, restart_decision()[0])
    assert choice.kind == rule.COLD and "second fault" in choice.reason


def test_the_order_goes_to_every_node_and_again_until_the_waiting_ranks_took_it(tmp_path: Path) -> None:
    started: list[Any] = []
    w, channel, _ = warm_restarts(tmp_path, [view(0), view(1, alive=False), view(2)], started=started)
    launch = launch_of(tmp_path)
    first_proc = launch.proc
    order = RestartOrder(1, {"MASTER_PORT": "23456"})

    def take_it_later() -> None:  # the survivors read the order after a few resends
        time.sleep(1.2)
        channel.table.ranks = [view(0, flags=RANK_FLAG_RESTARTABLE), view(2, flags=RANK_FLAG_RESTARTABLE)]

    import threading

    helper = threading.Thread(target=take_it_later)
    helper.start()
    dead, untaken = w.restart(launch, rule.WarmChoice(rule.WARM, (1,)), order)
    helper.join()
    assert dead == [101] and untaken == ()
    assert {node for node, _ in channel.orders} == {"n0", "n1", "n2"}
    assert len(channel.orders) > 3, "the order was not sent again while the ranks still waited"
    assert json.loads(channel.orders[0][1]) == {"restart": {"generation": 1, "env": {"MASTER_PORT": "23456"}}}
    (argv, env), = started
    assert "--job-name=train-1-g1-r1" in argv and "--nodelist=n1" in argv and argv[-2:] == ["python", "train.py"]
    assert (env["RANK"], env["LOCAL_RANK"], env["NODE_RANK"], env["WORLD_SIZE"]) == ("9", "0", "1", "3")  # user's RANK kept
    assert env["MASTER_PORT"] == "23456" and env["SUPERVISOR_GENERATION"] == "1" and env["SUPERVISOR_WARM_RESTART"] == "1"
    assert launch.generation == 1 and [r.rank for r in launch.replaced] == [1]
    assert isinstance(launch.proc, LaunchProcs) and launch.proc.procs[0] is first_proc
    assert launch.names == ("train-1", "train-1-g1-r1")


def test_the_restart_order_gives_a_fresh_port_and_the_resume_point(tmp_path: Path) -> None:
    t = trainer(tmp_path, [])
    t.launches = 2
    launch = launch_of(tmp_path)
    launch.number = 2
    order = t.restart_order(launch, 1, "/ck/step_20", True, 22, "7-0-1", "")
    env = order.env
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["MASTER_PORT"].isdigit()
    assert env["SUPERVISOR_RESUME_FROM"] == "/ck/step_20" and env["SUPERVISOR_RESUME_MEMORY_STEP"] == "22"
    assert env["SUPERVISOR_RESUME_MEMORY_LAUNCH"] == "7-0-1" and env["SUPERVISOR_RESUME_MEMORY_FLUSHED"] is None
    assert env["SUPERVISOR_LAUNCH"] == "7-0-2" and env["SUPERVISOR_SKIP_STEPS"] is None
    again = t.restart_order(launch, 2, None, True, None, "", "")
    assert again.env["MASTER_PORT"] != env["MASTER_PORT"] and again.env["SUPERVISOR_RESUME_MEMORY_STEP"] is None


def test_the_launchs_sruns_are_seen_as_one() -> None:
    a, b = FakeProcess(), FakeProcess()
    procs = LaunchProcs([a, b])
    assert procs.poll() is None
    a.returncode = 137
    assert procs.poll() is None  # the training step's srun reports the killed rank; the new rank still runs
    b.returncode = 0
    assert procs.poll() == 137
    c = FakeProcess()
    procs.add(c)
    procs.kill()
    assert c.returncode is not None and procs.poll() == 137


def test_the_launch_log_is_read_from_the_restart_on(tmp_path: Path) -> None:
    path = tmp_path / "train-1.log"
    path.write_text("0: step=1 loss=0.5\nsrun: error: n1: task 1: Killed\n1: RuntimeError: Connection closed by peer\n")
    log = LaunchLog(path, tasks=3)
    assert any("Killed" in line for line in log.lines())
    again = LaunchLog(path, tasks=3).from_now()
    with path.open("a") as f:
        f.write("0: step=11 loss=0.4\n0: ValueError: a new failure\n")
    lines = again.lines()
    assert not any("Killed" in line or "Connection closed" in line for line in lines), lines
    assert any("a new failure" in line for line in lines)


def judge_of(ranks: list[RankView]) -> Any:
    """A Watcher's launch-end judgement over ``ranks`` (the agents' view), without the rest of a Watcher."""
    judge = SimpleNamespace(ranks=lambda launch: ranks, ended_well_since=None)
    judge.generation_ended_well = lambda launch: Watcher.generation_ended_well(judge, launch)  # type: ignore[arg-type]
    return judge


def test_a_warm_launch_ended_well_although_srun_reports_the_rank_it_replaced(tmp_path: Path) -> None:
    launch = launch_of(tmp_path)
    launch.generation = 1
    rep = SimpleNamespace(generation=1, proc=FakeProcess())
    rep.proc.returncode = 0
    launch.replaced = [rep]  # type: ignore[list-item]
    done = [view(r, alive=False, flags=RANK_FLAG_RESTARTABLE | RANK_FLAG_RETURNED) for r in range(3)]
    judge = judge_of(done)
    assert Watcher.generation_code(judge, launch, 137) == 0
    crashed = [*done[:2], view(2, alive=False, flags=RANK_FLAG_RESTARTABLE)]  # rank 2 never returned
    assert Watcher.generation_code(judge_of(crashed), launch, 137) == 137
    # under torchrun the kept ranks' torchrun waits in its exit barrier: the launch ended once that lasted
    assert not Watcher.lingers(judge, launch, 100.0) and Watcher.lingers(judge, launch, 103.5)
    assert not Watcher.lingers(judge_of(crashed), launch, 200.0)
    rep.proc.returncode = 1  # the rank started again failed
    assert Watcher.generation_code(judge, launch, 137) == 137
    judge.ended_well_since = None
    assert not Watcher.lingers(judge, launch, 300.0) and not Watcher.lingers(judge, launch, 310.0)
    launch.generation = 0
    assert Watcher.generation_code(judge, launch, 137) == 137


def test_the_agent_finds_a_rank_started_again_under_its_rank_not_its_task_id() -> None:
    job = f"8{os.getpid()}"
    env = {**os.environ, "SLURM_JOB_ID": job, "SLURMD_NODENAME": "nodeA", "SLURM_PROCID": "0", "SLURM_STEP_ID": "3",
           "RANK": "5", "SUPERVISOR_GENERATION": "1"}  # fmt: skip
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    try:
        deadline = time.monotonic() + 20
        found: dict[int, int] = {}
        while time.monotonic() < deadline and not found:
            found = find_ranks(job, "nodeA")
            time.sleep(0.1)
        assert found == {5: proc.pid}
    finally:
        proc.kill()
        proc.wait()


def test_the_report_and_status_show_a_warm_restart_and_its_generation() -> None:
    from supervisor import report_view
    from supervisor.commands.status import summary_line

    events = [
        {"v": 1, "t": 1.0, "type": "attempt_started", "job_id": "7", "restart": 0, "nodes": ["n0", "n1"]},
        {"v": 1, "t": 2.0, "type": "step_launched", "launch": 1, "nodes": ["n0", "n1"], "warm": True},
        {"v": 1, "t": 9.0, "type": "interruption", "class": "unknown", "blamed_nodes": [], "launch": 1},
        {"v": 1, "t": 9.1, "type": "step_launched", "launch": 2, "nodes": ["n0", "n1"], "warm": True, "generation": 1,
         "replaced_ranks": [1], "resume_step": 5, "log": "train-1.log"},
    ]  # fmt: skip
    doc = report_view.fold(events, now=10.0)
    first, again = doc["attempts"]
    assert "generation" not in first and (again["warm"], again["generation"], again["replaced_ranks"]) == (True, 1, [1])
    line = summary_line({"state": doc["state"], "attempts": 2, "last_attempt": again})
    assert "warm restart, generation 1, ranks started again: 1" in line
    hostile = [*events[:3], {**events[3], "replaced_ranks": 7, "generation": "x"}]
    assert report_view.fold(hostile, now=10.0)["attempts"][1]["replaced_ranks"] == []


def test_a_rank_started_again_that_dies_at_start_ends_the_watch(tmp_path: Path) -> None:
    """Its peers wait for it in the new rendezvous (the agents may never see it as a rank): the watch ends with
    its exit, and the next warm choice is cold (the generation never trained)."""
    launch = launch_of(tmp_path)
    launch.generation = 1
    rep = SimpleNamespace(rank=1, node="n1", generation=1, name="train-2-g1-r1", proc=FakeProcess())
    launch.replaced = [rep]  # type: ignore[list-item]
    assert Watcher.replacement_failed(SimpleNamespace(), launch) is None  # type: ignore[arg-type]
    rep.proc.returncode = 0  # ended well: the launch's end says the rest
    assert Watcher.replacement_failed(SimpleNamespace(), launch) is None  # type: ignore[arg-type]
    rep.proc.returncode = 1
    found = Watcher.replacement_failed(SimpleNamespace(), launch)  # type: ignore[arg-type]
    assert found is not None and found.kind == "rank_exited" and found.ranks == (1,) and "code 1" in found.evidence[0]
    launch.generation = 2  # an older generation's replacement is history
    assert Watcher.replacement_failed(SimpleNamespace(), launch) is None  # type: ignore[arg-type]


def test_a_rank_started_again_that_never_shows_up_ends_the_watch_as_a_hang_blaming_no_node(tmp_path: Path) -> None:
    """Found on Slurm (a standby whose assignment its agent refused): the kept ranks waited in the rendezvous for
    2 minutes (gloo's store timeout) before a cold relaunch. Now a replacement missing from the slots past the
    deadline (twice the launch's start-up, at least 60 s) ends the watch: a hang of the restart, no node blamed."""
    launch = launch_of(tmp_path)
    launch.generation, launch.startup_s = 1, 45.0  # deadline: 90 s
    rep = SimpleNamespace(rank=1, node="n1", generation=1, name="train-1-standby-4", proc=FakeProcess(),
                          started_at=1000.0)  # fmt: skip
    launch.replaced = [rep]  # type: ignore[list-item]
    shown: list[Any] = [SimpleNamespace(rank=0, pid=10), SimpleNamespace(rank=2, pid=12)]
    watcher = SimpleNamespace(ranks=lambda launch: shown)
    assert Watcher.replacement_missing(watcher, launch, 1089.0) is None  # type: ignore[arg-type]
    found = Watcher.replacement_missing(watcher, launch, 1091.0)  # type: ignore[arg-type]
    assert found is not None and found.kind == "rank_hang" and found.ranks == (1,) and found.nodes == ()
    assert "train-1-standby-4" in found.evidence[0] and found.threshold == 90.0
    shown.append(SimpleNamespace(rank=1, pid=44))  # it showed up (late): nothing to say
    assert Watcher.replacement_missing(watcher, launch, 2000.0) is None  # type: ignore[arg-type]
    shown.pop()
    launch.startup_s = None  # the launch never stepped: its start-up unknown, nobody is given up on missing data
    assert Watcher.replacement_missing(watcher, launch, 5000.0) is None  # type: ignore[arg-type]


def test_a_waiting_rank_that_holds_its_peers_back_is_killed_once_after_the_grace(tmp_path: Path) -> None:
    """Rank 1 waits for its order while ranks 0 and 2, alive, are stuck on it: after the grace its agent is told to
    kill it, once, and the kill is journaled with the reason."""
    from supervisor.heartbeat import wire

    channel, record = FakeChannel("7"), Recorded()
    watcher = SimpleNamespace(stuck_since=None, released=set(), channel=channel, ctx=Context.of(record))
    views = [rule.RankView(0, "n0", True, True, False), rule.RankView(1, "n1", True, True, True),
             rule.RankView(2, "n2", True, True, False)]  # fmt: skip
    launch = launch_of(tmp_path)
    Watcher.release_held_back(watcher, launch, views, now=100.0)  # type: ignore[arg-type]
    Watcher.release_held_back(watcher, launch, views, now=103.0)  # type: ignore[arg-type]
    assert not channel.sent and not record.events  # within the grace
    Watcher.release_held_back(watcher, launch, views, now=105.5)  # type: ignore[arg-type]
    Watcher.release_held_back(watcher, launch, views, now=107.0)  # type: ignore[arg-type]
    assert [(node, [(c.command, c.rank) for c in cmds]) for node, cmds in channel.sent] == \
        [("n1", [(wire.CMD_KILL_RANK, 1)])]  # fmt: skip
    assert [e["kind"] for e in record.events] == ["kill_ranks"] and record.events[0]["target"] == ["1"]
    moving = [rule.RankView(0, "n0", True, True, False), rule.RankView(1, "n1", True, True, False)]
    Watcher.release_held_back(watcher, launch, moving, now=200.0)  # type: ignore[arg-type]
    assert watcher.stuck_since is None  # nobody waits: the clock starts again


def test_ranks_stuck_while_every_waiting_rank_failed_on_a_peer_end_the_watch_as_a_hang_of_those(tmp_path: Path) -> None:
    """Ranks 0 and 2 wait after their collectives timed out on rank 1 (the backend saw the hang first): nobody is
    killed for holding back; after the grace the watch gets a rank_hang naming rank 1, which the warm restart then
    kills alone (its stack saved) like any hang's."""
    from supervisor.decisions.detect import RANK_HANG

    channel, record = FakeChannel("7"), Recorded()
    watcher = SimpleNamespace(stuck_since=None, released=set(), channel=channel, ctx=Context.of(record))
    views = [rule.RankView(0, "n0", True, True, True, True), rule.RankView(1, "n1", True, True, False),
             rule.RankView(2, "n2", True, True, True, True)]  # fmt: skip
    launch = launch_of(tmp_path)
    assert Watcher.release_held_back(watcher, launch, views, now=100.0) is None  # type: ignore[arg-type]
    hung = Watcher.release_held_back(watcher, launch, views, now=106.0)  # type: ignore[arg-type]
    assert hung is not None and hung.kind == RANK_HANG and hung.ranks == (1,) and hung.nodes == ("n1",)
    assert "collective fail on a peer" in hung.evidence[0]
    assert not channel.sent and not record.events, "a victim was killed"
    interruption, decision = restart_decision("hang")
    w, _, _ = warm_restarts(tmp_path, [])
    assert w.plan(launch, interruption, decision, (hung,)) == (1,)


def test_a_rank_started_again_has_its_own_log_judged_labelled_with_its_rank(tmp_path: Path) -> None:
    """The rank started again writes its own log: its traceback is part of the evidence of the next failure, as
    rank 1's line (never as an unlabelled line, which the classifier would take for srun's or Slurm's own)."""
    w, channel, _ = warm_restarts(tmp_path, [view(0, flags=RANK_FLAG_RESTARTABLE), view(2, flags=RANK_FLAG_RESTARTABLE)])
    launch = launch_of(tmp_path)
    launch.log_path.write_text("0: step=11\n")
    w.restart(launch, rule.WarmChoice(rule.WARM, (1,)), RestartOrder(1, {}))
    (rep,) = launch.replaced
    rep.log_path.write_text("Traceback (most recent call last):\nsrun: error: Node failure on n0\n"
                            "ValueError: a bad sample\n")  # fmt: skip
    lines = launch.reader.lines()
    assert lines[-3:] == ["1: Traceback (most recent call last):", "1: srun: error: Node failure on n0",
                          "1: ValueError: a bad sample"], lines  # fmt: skip
    again = launch.reader.from_now()  # the next generation: rank 1's process still runs, its new lines count
    with open(rep.log_path, "a") as f:
        f.write("RuntimeError: later\n")
    assert again.lines()[-1:] == ["1: RuntimeError: later"]


def test_a_rank_still_stuck_while_the_others_wait_is_killed_and_started_again_with_the_dead(tmp_path: Path,
                                                                                           monkeypatch: Any) -> None:  # fmt: skip
    """Seen under torchrun on Slurm: both ranks of one node dead, rank 3 waiting (its collective failed on a peer),
    rank 2 still in its all_reduce. Waiting out the release deadline made the restart cold; instead the stuck
    rank is killed by its agent once the grace passed (as the watch does) and started again with the dead."""
    import functools

    from supervisor.client.layout import RANK_FLAG_PEER_FAILED
    from supervisor.heartbeat import wire

    monkeypatch.setattr(rule, "hung_by_peers", functools.partial(rule.hung_by_peers, grace_s=0.05))
    ranks = [view(0, alive=False), view(1, alive=False), view(2, flags=RANK_FLAG_RESTARTABLE),
             view(3, flags=RESTARTING | RANK_FLAG_PEER_FAILED)]  # fmt: skip
    w, channel, record = warm_restarts(tmp_path, ranks)
    w.release_deadline_s = 5.0
    sent = channel.send

    def send(node: str, cmds: Any) -> bool:  # the agent kills the rank: it is gone in the next report
        for cmd in cmds:
            if cmd.command == wire.CMD_KILL_RANK:
                channel.table.ranks = [view(r.rank, alive=False) if r.rank == cmd.rank else r
                                       for r in channel.table.ranks]  # fmt: skip
        return sent(node, cmds)

    channel.send = send  # type: ignore[method-assign]
    choice = w.choose(launch_of(tmp_path), restart_decision()[0])
    assert choice.kind == rule.WARM and choice.replace == (0, 1, 2), choice
    killed = [e for e in record.events if e.get("kind") == "kill_ranks"]
    assert [e["target"] for e in killed] == [["2"]], record.events
    assert [(node, [c.rank for c in cmds]) for node, cmds in channel.sent] == [("n2", [2])]


def test_a_torchrun_launchs_dead_node_is_started_again_as_torchruns_workers_without_it(tmp_path: Path,
                                                                                       monkeypatch: Any) -> None:  # fmt: skip
    """Under ``srun torchrun`` (2 nodes x 2 workers) the ranks are torchrun's workers, placed by its rendezvous:
    the dead node's ranks start again as ``PYTHON -u SCRIPT ARGS`` on that node with torchrun's worker variables,
    rank 0's node hosts the new rendezvous (no torchrun store: TORCHELASTIC_USE_AGENT_STORE False), and srun's
    report of the dead node's torchrun is the past fault's."""
    started: list[tuple[list[str], dict[str, str]]] = []
    command = ("/usr/bin/python3", "-m", "torch.distributed.run", "--nproc-per-node=2", "t.py", "--lr", "1")
    t = TrainingLauncher(Context.of(lambda e: None), start=lambda argv, env, log, cwd=None: (  # type: ignore[misc]
                             started.append((list(argv), dict(env))) or FakeProcess()),
                         layout=TrainingLayout(("n0", "n1"), 1), command=command, cwd=None, srun_args=(), job_id="7",
                         restart_count=0, campaign=Path("/c"), log_dir=tmp_path,
                         node_addresses={"n0": "10.0.0.1", "n1": "10.0.0.2"}, checkpoint_dir_known=True,
                         environ={"PATH": "/bin"})  # fmt: skip
    assert t.ranks_per_node == 2
    channel, record = FakeChannel("7"), Recorded()
    # the rendezvous put ranks 0-1 on n1 and 2-3 on n0; n0's workers died (its torchrun stopped the other)
    channel.table.ranks = [RankView(0, "n1", pid=10, state=procstate.RUNNING, rank_flags=RESTARTING, beats=5),
                           RankView(1, "n1", pid=11, state=procstate.RUNNING, rank_flags=RESTARTING, beats=5),
                           RankView(2, "n0", pid=12, state=procstate.GONE, rank_flags=RESTARTING, beats=5),
                           RankView(3, "n0", pid=13, state=procstate.RUNNING, rank_flags=RESTARTING, beats=5)]  # fmt: skip
    # (rank 3 still alive, waiting: its program caught torchrun's SIGTERM; it goes with its node all the same)
    w = WarmRestarts(Context.of(record), mode="auto", command=command, channel=channel, trainer=t,
                     ranks_of=lambda launch: list(channel.table.ranks), tasks_per_node=1)  # fmt: skip
    launch = Launch(1, "train-1", FakeProcess(), tmp_path / "train-1.log", time.monotonic(), ("n0", "n1"), warm=True)
    launch.log = LaunchLog(launch.log_path, tasks=2)
    w.saw(launch)
    assert w.next_launch_warm(), "every one of the 4 workers ran inside client.restartable"
    choice = w.choose(launch, restart_decision()[0])
    assert choice.kind == rule.WARM and choice.replace == (2, 3)
    assert [e["target"] for e in record.events if e.get("kind") == "kill_ranks"] == [["3"]]
    assert [(node, [c.rank for c in cmds]) for node, cmds in channel.sent] == [("n0", [3])]
    order = t.restart_order(launch, 1, None, True, None, "", "", w.node_of(launch, 0))
    assert order.env["MASTER_ADDR"] == "10.0.0.2" and order.env["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    monkeypatch.setattr("supervisor.driver.warm_restart.ORDER_TAKEN_WAIT_S", 0.1)  # (the fakes never take it)
    dead, untaken = w.restart(launch, choice, order)
    assert sorted(dead) == [12, 13] and untaken == (0, 1)
    (argv2, env2), (argv3, env3) = started
    assert argv2[argv2.index("--nodelist=n0") + 1:] == ["--kill-on-bad-exit=1", "--mem=0", "/usr/bin/python3", "-u",
                                                       "t.py", "--lr", "1"]  # fmt: skip
    assert (env2["RANK"], env2["LOCAL_RANK"], env2["WORLD_SIZE"], env2["LOCAL_WORLD_SIZE"], env2["GROUP_RANK"]) == \
        ("2", "0", "4", "2", "1")  # fmt: skip
    assert env3["RANK"] == "3" and env3["LOCAL_RANK"] == "1" and env3["TORCHELASTIC_USE_AGENT_STORE"] == "False"
    assert launch.reader.settled == {0}, "n0's torchrun is srun's task 0: its end was this fault's"
    launch.log_path.write_text("srun: error: n0: task 0: Exited with exit code 1\n1: step=9 loss=1\n")
    assert not any("task 0" in line for line in launch.reader.lines())

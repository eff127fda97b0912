"""Agent parts in-process: slot sampling against real slots and processes, and control-frame handling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.agent.flush_copy import Flusher
from supervisor.agent.main import Agent
from supervisor.agent.procwatch import ProcWatch
from supervisor.agent.sampler import RankSlots
from supervisor.client.restart_order import RestartOrder, read_order
from supervisor.client.slot import FLAG_STOP, SlotWriter
from supervisor.heartbeat import wire
from supervisor.heartbeat.orders import Flush, FlushShard, restart_order_text
from supervisor.paths import expand_slot_dir

KEY = wire.derive_key(b"a" * 32)


def slot_dir(tmp: Path) -> Path:
    d = tmp / "slots"
    d.mkdir(mode=0o700, exist_ok=True)
    return d


def test_sampler_reports_a_live_rank_with_its_step_age_and_cpu(tmp_path: Path) -> None:
    d = slot_dir(tmp_path)
    w = SlotWriter.create(d, 5, 1, 8)
    for i in range(4):
        w.beat(i, 0.5)
    slots = RankSlots(d)
    slots.scan()
    (e,) = slots.sample()
    assert (e.rank, e.pid, e.step, e.loss, e.loss_step, e.beats) == (5, os.getpid(), 3, 0.5, 3, 4)
    assert e.state in (wire.ST_RUNNING, wire.ST_SLEEPING)
    assert e.beat_age_ms < 5000 and e.cpu_s > 0
    slots.close()
    w.close()


def test_sampler_passes_rank_flags_above_the_first_byte(tmp_path: Path) -> None:
    """RANK_FLAG_PEER_FAILED (bit 8) reaches the wire: without it the supervisor would kill the peers of a hung
    rank as if they held it back."""
    from supervisor.client.slot import RANK_FLAG_AWAITING_RESTART, RANK_FLAG_PEER_FAILED

    d = slot_dir(tmp_path)
    w = SlotWriter.create(d, 5, 1, 8)
    w.beat(1, 0.5)
    w.set_async_flag(RANK_FLAG_AWAITING_RESTART | RANK_FLAG_PEER_FAILED)
    slots = RankSlots(d)
    slots.scan()
    (e,) = slots.sample()
    assert e.rank_flags & RANK_FLAG_PEER_FAILED and e.rank_flags & RANK_FLAG_AWAITING_RESTART
    slots.close()
    w.close()


def test_sampler_sees_a_dead_rank_as_gone_then_follows_its_restart(tmp_path: Path) -> None:
    d = slot_dir(tmp_path)
    code = ("import sys; from supervisor.client.slot import SlotWriter; "
            "w = SlotWriter.create(sys.argv[1], 2, 0, 4); w.beat(7, None)")
    subprocess.run([sys.executable, "-c", code, str(d)], check=True, timeout=60)
    slots = RankSlots(d)
    slots.scan()
    (e,) = slots.sample()
    assert e.state == wire.ST_GONE and e.step == 7 and e.loss_step == -1
    w = SlotWriter.create(d, 2, 0, 4)  # the rank restarts (here: in this process) and reuses its slot
    w.beat(0, None)
    slots.scan()
    (e,) = slots.sample()
    assert e.pid == os.getpid() and e.state in (wire.ST_RUNNING, wire.ST_SLEEPING) and e.step == 0
    os.unlink(d / "rank-2.slot")
    slots.scan()
    assert slots.sample() == []
    slots.close()
    w.close()


def test_procwatch_does_not_mistake_a_recycled_pid_for_the_rank() -> None:
    me = psutil.Process().create_time()
    assert ProcWatch().sample(os.getpid(), started_by=me + 0.5)[0] in (wire.ST_RUNNING, wire.ST_SLEEPING)
    # A slot whose rank was alive long before this process existed: this pid is someone else now.
    assert ProcWatch().sample(os.getpid(), started_by=me - 100)[0] == wire.ST_GONE
    assert ProcWatch().sample(0)[0] == wire.ST_NO_PID


def _agent(tmp: Path) -> Agent:
    return Agent(job="9", node="n1", key=KEY, supervisor=("127.0.0.1", 9), slot_dir=slot_dir(tmp),
                 campaign=tmp, keep_slot_dir=True)


def _control(seq: int, cmds: list[wire.Command], *, node: str = "n1", key: bytes = KEY) -> bytes:
    return wire.encode_control(key, instance=11, seq=seq, wall_ns=time.time_ns(), mono_ns=0, job="9", node=node,
                               commands=cmds)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=1500))
def test_agent_counts_garbage_and_never_raises(tmp_path: Path, data: bytes) -> None:
    agent = _agent(tmp_path)
    try:
        agent.handle(data)
        assert agent.counters["control_ok"] == 0
        assert sum(v for k, v in agent.counters.items() if k.startswith("rejected_")) == 1
    finally:
        agent.close()


def test_agent_obeys_only_fresh_frames_for_its_node(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    w = SlotWriter.create(agent.slot_dir, 0, 0, 1)
    w.beat(1, None)
    try:
        agent.slots.scan()
        agent.slots.sample()
        agent.handle(_control(1, [wire.Command(wire.CMD_SET_FLAGS, 0, wire.flags_arg(FLAG_STOP))], node="n2"))
        agent.handle(_control(1, [wire.Command(wire.CMD_SET_FLAGS, 0, wire.flags_arg(FLAG_STOP))],
                              key=wire.derive_key(b"z" * 32)))
        assert not w.should_stop()
        frame = _control(2, [wire.Command(wire.CMD_SET_FLAGS, 0, wire.flags_arg(FLAG_STOP))])
        agent.handle(frame)
        assert w.should_stop()
        agent.handle(frame)  # replayed
        agent.handle(_control(3, [wire.Command(wire.CMD_EXIT)]))
        assert agent.stop_reason == "the supervisor asked the agent to exit"
        assert dict(agent.counters) == {"rejected_node": 1, "rejected_mac": 1, "control_ok": 2, "rejected_replay": 1}
    finally:
        agent.close()
        w.close()


def test_slot_dir_placeholders_give_one_dir_per_node() -> None:
    assert expand_slot_dir("/dev/shm/s-{job}-{uid}-{node}", job="12", node="node3") == \
        Path(f"/dev/shm/s-12-{os.getuid()}-node3")


def test_stack_dump_is_never_signalled_to_a_rank_without_the_handler(tmp_path: Path) -> None:
    from supervisor.agent.stacks import StackDumps

    d = slot_dir(tmp_path)
    w = SlotWriter.create(d, 0, 0, 1)  # no faulthandler registered, flag not advertised
    w.beat(1, None)
    slots = RankSlots(d)
    slots.scan()
    slots.sample()
    dumps = StackDumps(d, tmp_path / "stacks", "n1", pyspy=None)  # py-spy off: see test_stacks.py for it
    ev = dumps.request(0, slots.records[0])  # would kill this very test process if it signalled
    assert ev is not None and ev.kind == wire.EVENT_STACKS_FAILED and "no stack-dump handler" in ev.text
    assert dumps.request(3, None) == wire.Event(wire.EVENT_STACKS_FAILED, 3, "no slot for this rank on this node")
    assert dumps.pending == {}
    slots.close()
    w.close()


class _Memory:
    """The agent's view of its memory tier in these tests: whether the store holds snapshots, and the real
    flusher that carries out the supervisor's flush orders (here, a gate holds a flush under way)."""

    def __init__(self, root: Path, holds: bool) -> None:
        self.holds, self.flusher = holds, Flusher(root)

    def holds_snapshots(self) -> bool:
        return self.holds

    def close(self) -> None:
        self.flusher.join(5)


def _lingering_agent(tmp: Path, holds: bool = True) -> Agent:
    agent = _agent(tmp)
    agent.memory = _Memory(tmp / "store", holds)  # type: ignore[assignment]
    agent.linger_s = 0.3
    return agent


def test_sigterm_ends_an_agent_without_snapshots_at_once(tmp_path: Path) -> None:
    agent = _lingering_agent(tmp_path, holds=False)
    try:
        agent.terminate("received SIGTERM")
        assert agent._should_exit(time.monotonic()) == "received SIGTERM"
    finally:
        agent.close()


def test_sigterm_with_snapshots_in_memory_waits_for_the_flush_order_then_for_the_copy(tmp_path: Path) -> None:
    """Slurm signals the agent with the ranks when it preempts the job; the supervisor's flush order comes
    after. The agent stays for it, does not leave while the copy runs, and leaves once it is done."""
    agent = _lingering_agent(tmp_path)
    gate = threading.Event()
    ran = agent.memory.flusher.run  # type: ignore[union-attr]
    agent.memory.flusher.run = lambda flush: (gate.wait(10), ran(flush))  # type: ignore[union-attr]
    try:
        agent.terminate("received SIGTERM")
        assert agent._should_exit(time.monotonic()) == "", "left before the flush order could come"
        agent.memory.flusher.order(Flush(str(tmp_path / "flushed"), ()))  # type: ignore[union-attr]
        time.sleep(0.5)  # past linger_s: a copy under way keeps the agent
        assert agent._should_exit(time.monotonic()) == ""
        gate.set()
        agent.memory.flusher.join(5)  # type: ignore[union-attr]
        assert agent._should_exit(time.monotonic()) == "received SIGTERM (after the memory flush)"
        assert (tmp_path / "flushed").is_dir()
    finally:
        gate.set()
        agent.close()


def test_sigterm_with_snapshots_leaves_after_the_linger_when_no_flush_is_ordered(tmp_path: Path) -> None:
    agent = _lingering_agent(tmp_path)
    try:
        agent.terminate("received SIGTERM")
        assert agent._should_exit(time.monotonic()) == ""
        assert agent._should_exit(time.monotonic() + 1) == "received SIGTERM (no flush ordered within 0.3 s)"
    finally:
        agent.close()


def test_a_second_sigterm_or_a_flush_already_done_ends_the_agent_at_once(tmp_path: Path) -> None:
    agent = _lingering_agent(tmp_path)
    try:
        agent.terminate("received SIGTERM")
        agent.terminate("received SIGTERM")
        assert agent._should_exit(time.monotonic()) == "received SIGTERM"
    finally:
        agent.close()
    (tmp_path / "b").mkdir()
    flushed = _lingering_agent(tmp_path / "b")
    try:
        flushed.memory.flusher.order(Flush(str(tmp_path / "b" / "flushed"), ()))  # type: ignore[union-attr]
        flushed.memory.flusher.join(5)  # type: ignore[union-attr]
        flushed.terminate("received SIGTERM")  # the time limit's flush came before Slurm's SIGTERM
        assert flushed._should_exit(time.monotonic()) == "received SIGTERM"
    finally:
        flushed.close()


def test_a_background_persist_is_not_the_stops_flush_the_agent_waits_for(tmp_path: Path) -> None:
    """The periodic persists (driver.memory_persist) run while the training does: one done before Slurm's
    SIGTERM must not end the agent at once, or the preempted job's own flush order would find no agent."""
    agent = _lingering_agent(tmp_path)
    try:
        agent.memory.flusher.order(Flush(str(tmp_path / "persisted"), (), background=True))  # type: ignore[union-attr]
        agent.memory.flusher.join(5)  # type: ignore[union-attr]
        agent.terminate("received SIGTERM")
        assert agent._should_exit(time.monotonic()) == "", "left before the stop's flush order could come"
        agent.memory.flusher.order(Flush(str(tmp_path / "flushed"), ()))  # type: ignore[union-attr]
        agent.memory.flusher.join(5)  # type: ignore[union-attr]
        assert agent._should_exit(time.monotonic()) == "received SIGTERM (after the memory flush)"
    finally:
        agent.close()


def test_a_stops_flush_goes_before_background_persists_still_queued(tmp_path: Path) -> None:
    flusher = Flusher(tmp_path / "store")
    gate, done = threading.Event(), []
    flusher.run = lambda flush: (gate.wait(10), done.append(Path(flush.directory).name))  # type: ignore[method-assign]
    flusher.order(Flush(str(tmp_path / "p1"), (), background=True))  # under way (held by the gate)
    time.sleep(0.1)
    flusher.order(Flush(str(tmp_path / "p2"), (), background=True))
    flusher.order(Flush(str(tmp_path / "stop"), ()))
    flusher.order(Flush(str(tmp_path / "p3"), (), background=True))  # a newer persist replaces p2
    gate.set()
    flusher.join(5)
    assert done == ["p1", "stop", "p3"] and flusher.finished == 1


def test_a_background_copy_waiting_for_its_snapshot_gives_way_to_the_next_order(tmp_path: Path) -> None:
    """A persist of a launch whose ranks died waits for a snapshot that never comes: the relaunch's persist (or a
    stop's flush) must not queue behind that wait."""
    flusher = Flusher(tmp_path / "store")
    (tmp_path / "store").mkdir()
    waiting = Flush(str(tmp_path / "old"), (FlushShard(99, 0, "j-0-1"),), background=True)
    started = time.monotonic()
    flusher.order(waiting)
    time.sleep(0.2)
    flusher.order(Flush(str(tmp_path / "new"), (FlushShard(99, 0, "j-0-2"),), background=True))
    time.sleep(0.2)
    flusher.order(Flush(str(tmp_path / "stop"), ()))
    flusher.join(10)
    assert not flusher.busy() and time.monotonic() - started < 5 and flusher.finished == 1
    assert flusher.counters["flush_missing"] == 2


def test_an_authenticated_restart_order_is_written_for_the_ranks_and_a_forged_one_is_not(tmp_path: Path) -> None:
    """The ranks restarting in their processes read the order the agent writes into their slot directory; an
    order sealed with another key, or one setting a variable orders may not set, never reaches them."""
    agent = _agent(tmp_path)

    def order(seq: int, text: str, key: bytes = KEY) -> bytes:
        return wire.encode_order(key, instance=11, seq=seq, wall_ns=time.time_ns(), mono_ns=0, job="9", node="n1",
                                 text=text)  # fmt: skip

    try:
        wanted = RestartOrder(2, {"MASTER_PORT": "24001", "SUPERVISOR_RESUME_FROM": None})
        agent.handle(order(1, restart_order_text(wanted), key=wire.derive_key(b"z" * 32)))
        agent.handle(order(2, '{"restart":{"generation":2,"env":{"LD_PRELOAD":"/tmp/x.so"}}}'))
        assert read_order(agent.slot_dir) is None
        agent.handle(order(3, restart_order_text(wanted)))
        assert read_order(agent.slot_dir) == wanted
        assert agent.counters["restart_orders"] == 1 and agent.counters["rejected_mac"] == 1
        assert agent.counters["rejected_order_restart"] == 1
    finally:
        agent.close()


def test_the_agent_kills_one_hung_rank_when_asked_and_never_every_rank_at_once(tmp_path: Path) -> None:
    """Before a warm restart the supervisor has a hung rank killed alone (its peers' collectives then fail and they
    restart in their processes); a kill of ALL_RANKS is not obeyed (the step is killed with scancel instead)."""
    agent = _agent(tmp_path)
    victims = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    try:
        for rank, proc in enumerate(victims):
            agent.slots.slotless[rank] = proc.pid
            agent.slots.slotless_since[rank] = time.time()
        agent.handle(_control(1, [wire.Command(wire.CMD_KILL_RANK, wire.ALL_RANKS)]))
        time.sleep(0.2)
        assert [p.poll() for p in victims] == [None, None]
        os.kill(victims[1].pid, signal.SIGSTOP)  # a stopped rank dies of SIGKILL too
        agent.handle(_control(2, [wire.Command(wire.CMD_KILL_RANK, 1)]))
        assert victims[1].wait(timeout=10) == -signal.SIGKILL and victims[0].poll() is None
        assert agent.counters["kill_rank"] == 1
    finally:
        for p in victims:
            p.kill()
            p.wait()
        agent.close()


def test_a_standbys_assignment_is_written_for_it_and_a_bad_id_or_variable_is_refused(tmp_path: Path) -> None:
    from supervisor.client.restart_order import ASSIGN_ENV
    from supervisor.heartbeat.orders import assign_order_text

    agent = _agent(tmp_path)

    def order(seq: int, text: str) -> bytes:
        return wire.encode_order(KEY, instance=11, seq=seq, wall_ns=time.time_ns(), mono_ns=0, job="9", node="n1",
                                 text=text)  # fmt: skip

    try:
        wanted = RestartOrder(1, {"RANK": "3", "LOCAL_RANK": "1", "MASTER_PORT": "24002"})
        agent.handle(order(1, '{"assign":{"standby":"../x","generation":1,"env":{}}}'))
        agent.handle(order(2, '{"assign":{"standby":"s1","generation":1,"env":{"PYTHONPATH":"/tmp"}}}'))
        assert not list(agent.slot_dir.glob("standby-*"))
        agent.handle(order(3, assign_order_text("s1", wanted)))
        assert read_order(agent.slot_dir, "standby-s1.assign", ASSIGN_ENV) == wanted
        assert read_order(agent.slot_dir) is None  # not a restart order for the ranks
        assert agent.counters["standby_assignments"] == 1 and agent.counters["orders_without_memory"] == 0
        assert agent.counters["rejected_order_assign standby"] == 1 and agent.counters["rejected_order_assign"] == 1
    finally:
        agent.close()

"""Issue 10, findings 1, 5 and 6: replay across Slurm runs, the bind/advertised address, flood-bounded
receive, datagrams from outside the allocation, and the slot directory on a shared node.

Real sockets over loopback, a real in-process agent, real directories and symlinks; no mocks.
"""

from __future__ import annotations

import os
import socket
import stat
import time
from pathlib import Path

import pytest

from supervisor.agent.main import Agent, read_address_file
from supervisor.agent.slotdir import SlotDirError, make_slot_dir
from supervisor.errors import ConfigError
from supervisor.heartbeat import wire
from supervisor.heartbeat.secret import create_secret
from supervisor.heartbeat.server import AggregatorServer, ChannelError, bind_address, resolve_sources

JOB = "77"


def _summary(key: bytes, *, instance: int, seq: int, node: str = "n1") -> bytes:
    entry = wire.RankEntry(0, os.getpid(), 5, 1, wire.ST_RUNNING, 0, 0, 10, 0.5, 0.4, 0.6, 1.0, 5, 5, -1, 0, 0.0)
    return wire.encode_summary(key, instance=instance, seq=seq, wall_ns=time.time_ns(), mono_ns=time.monotonic_ns(),
                               job=JOB, node=node, ranks=[entry])


def _pump(server: AggregatorServer, until: float = 0.3) -> None:
    deadline = time.monotonic() + until
    while time.monotonic() < deadline:
        server.poll(0.02)


def _record_exit(server: AggregatorServer, node: str, key: bytes) -> bytes:
    """Pose as the node's agent, then capture the EXIT the server sends it (what an attacker would record)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.settimeout(5)
        sock.sendto(_summary(key, instance=1, seq=1, node=node), server.address)
        _pump(server, 0.2)
        assert server.send(node, [wire.Command(wire.CMD_EXIT)])
        while True:  # (a keepalive may come first)
            data, _ = sock.recvfrom(wire.MAX_FRAME + 1)
            if any(c.command == wire.CMD_EXIT for c in wire.commands(wire.decode(key, data, JOB))):
                return data


def test_frames_recorded_in_an_earlier_run_neither_lock_out_the_live_agent_nor_stop_it(tmp_path: Path) -> None:
    campaign = tmp_path / "c"
    run1 = AggregatorServer(campaign, JOB)
    recorded_exit = _record_exit(run1, "n1", run1.key)
    recorded_summaries = [_summary(run1.key, instance=1, seq=s) for s in range(2, 6)]
    run1.close()

    run2 = AggregatorServer(campaign, JOB, keepalive_interval_s=0.2)  # same campaign secret, same job id
    run2.write_address_file()
    try:
        (_, channel) = read_address_file(campaign)
        assert channel == run2.channel and channel != run1.channel and len(channel) == 16
        key = wire.derive_key(create_secret(campaign), channel)
        assert key == run2.key != run1.key
        agent = Agent(job=JOB, node="n1", key=key, supervisor=run2.address, slot_dir=tmp_path / "slots",
                      campaign=campaign, keep_slot_dir=True)
        try:
            agent.report([])
            _pump(run2)
            for data in recorded_summaries:  # replayed at the live run's aggregator, from the same host
                with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                    s.sendto(data, run2.address)
            _pump(run2)
            agent.report([])
            _pump(run2)
            assert run2.table.counters["rejected_mac"] == len(recorded_summaries)
            assert run2.table.counters["ok"] == 2 and run2.table.nodes["n1"].frames == 2  # the live agent is heard

            agent.handle(recorded_exit)  # a recorded EXIT from the earlier run stops nothing
            assert agent.stop_reason == "" and agent.counters["rejected_mac"] == 1
            run2.send("n1", [wire.Command(wire.CMD_KEEPALIVE)])
            time.sleep(0.1)
            agent._receive()
            assert agent.counters["control_ok"] >= 1 and agent.stop_reason == ""  # this run's frames still obeyed
        finally:
            agent.close()
    finally:
        run2.close()


def test_a_restarted_agent_refuses_a_control_frame_recorded_for_its_predecessor(tmp_path: Path) -> None:
    """Issue 22, low: a restarted agent's guard had no history, so an EXIT recorded within the freshness window
    (same run, same key) was obeyed. Agents now refuse frames sent before the supervisor started them."""
    campaign = tmp_path / "c"
    server = AggregatorServer(campaign, JOB)
    server.write_address_file()
    try:
        recorded_exit = _record_exit(server, "n1", server.key)  # for the agent that ran before
        started = time.time_ns()  # the supervisor starts the agents again (AgentStep.spawn: --not-before-ns)
        agent = Agent(job=JOB, node="n1", key=server.key, supervisor=server.address, slot_dir=tmp_path / "s1",
                      campaign=campaign, keep_slot_dir=True, not_before_ns=started)  # fmt: skip
        try:
            agent.handle(recorded_exit)
            assert agent.stop_reason == "" and agent.counters["rejected_replay"] == 1
        finally:
            agent.close()
        without = Agent(job=JOB, node="n1", key=server.key, supervisor=server.address, slot_dir=tmp_path / "s2",
                        campaign=campaign, keep_slot_dir=True)  # the old behaviour: no lower bound  # fmt: skip
        try:
            without.handle(recorded_exit)
            assert without.stop_reason == "the supervisor asked the agent to exit", without.counters
        finally:
            without.close()
    finally:
        server.close()


def test_the_address_file_is_private_and_holds_the_runs_channel(tmp_path: Path) -> None:
    server = AggregatorServer(tmp_path / "c", JOB)
    try:
        path = server.write_address_file()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert read_address_file(tmp_path / "c") == (server.address, server.channel)
        os.chmod(path, 0o644)
        with pytest.raises(ConfigError) as err:
            read_address_file(tmp_path / "c")
        assert "chmod 600" in err.value.one_line()
    finally:
        server.close()


def test_bind_address_is_one_agents_can_reach_or_a_clear_error() -> None:
    assert bind_address(None, "10.1.2.3") == "10.1.2.3"
    assert bind_address("192.168.0.7", "10.1.2.3") == "192.168.0.7"  # the override wins
    assert bind_address(" ", "node1") == "node1"
    for override, node_addr in ((None, None), ("0.0.0.0", "10.1.2.3"), (None, "0.0.0.0"), ("::", None), ("[::]", None)):
        with pytest.raises(ChannelError) as err:
            bind_address(override, node_addr)
        assert "SUPERVISOR_BIND" in err.value.one_line() and "\n" not in err.value.one_line()
        assert err.value.exit_code == 3


def test_sources_resolve_only_when_every_node_is_known() -> None:
    assert resolve_sources(["127.0.0.1", "localhost"]) is not None
    assert "127.0.0.1" in (resolve_sources(["127.0.0.1"]) or ())
    assert resolve_sources(["127.0.0.1", None]) is None  # one unknown node: no filter, nobody silenced
    assert resolve_sources(["no-such-host.invalid"]) is None


def test_datagrams_from_outside_the_allocation_are_dropped_before_the_mac(tmp_path: Path) -> None:
    server = AggregatorServer(tmp_path / "c", JOB, allowed_sources={"127.0.0.2"})
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(_summary(server.key, instance=1, seq=1), server.address)  # valid frame, wrong source
            s.sendto(b"junk", server.address)
        _pump(server, 0.2)
        assert server.table.counters == {"rejected_source": 2} and server.table.nodes == {}
    finally:
        server.close()


def test_a_junk_flood_cannot_hold_one_drain_for_long(tmp_path: Path) -> None:
    server = AggregatorServer(tmp_path / "c", JOB, rcvbuf=64 << 20)
    junk = os.urandom(wire.MAX_FRAME)
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            sent = 0
            for _ in range(3000):
                try:
                    s.sendto(junk, server.address)
                    sent += 1
                except OSError:
                    break
        queued = sent
        read_first = server.drain(budget_s=0.0)  # a zero budget still reads a first batch, then stops
        assert 0 < read_first <= 16 < queued
        total = read_first
        while (n := server.drain()) > 0:
            total += n
        assert server.table.counters["rejected_mac"] == total and "ok" not in server.table.counters
    finally:
        server.close()


def test_slot_dir_is_created_private_and_a_squatted_one_is_refused(tmp_path: Path) -> None:
    fresh = make_slot_dir(tmp_path / "fresh")
    assert stat.S_IMODE(os.lstat(fresh).st_mode) == 0o700
    os.chmod(fresh, 0o755)
    assert stat.S_IMODE(os.lstat(make_slot_dir(fresh)).st_mode) == 0o700  # our own (agent restart): tightened

    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o755)
    os.chmod(target, 0o755)
    (tmp_path / "planted").symlink_to(target)
    with pytest.raises(SlotDirError, match="not a directory"):
        make_slot_dir(tmp_path / "planted")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o755  # never chmod-ed through the link
    (tmp_path / "file").write_text("")
    with pytest.raises(SlotDirError):
        make_slot_dir(tmp_path / "file")


def test_slot_dir_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() == 0:  # root can make a directory that another user "created first"
        squatted = tmp_path / "squatted"
        squatted.mkdir(mode=0o777)
        os.chown(squatted, 65534, 65534)
    else:  # /tmp is root's: it stands for a directory another user created
        squatted = Path("/tmp")
    with pytest.raises(SlotDirError, match="owned by uid"):
        make_slot_dir(squatted)


def test_each_run_gets_an_unguessable_slot_dir_name() -> None:
    from supervisor.paths import expand_slot_dir, slot_dir_template

    a, b = slot_dir_template("5", "a1b2c3d4e5f60718"), slot_dir_template("5", "0f1e2d3c4b5a6978")
    assert a != b and a.endswith("-{node}") and "a1b2c3d4e5f60718" in a
    assert expand_slot_dir(a, job="5", node="node2").name == f"supervisor-5-{os.getuid()}-a1b2c3d4e5f60718-node2"


def test_the_agent_refuses_a_planted_slot_dir_with_one_clear_line(tmp_path: Path) -> None:
    from supervisor.agent.main import agent_from_args, build_parser

    server = AggregatorServer(tmp_path / "c", JOB)
    try:
        server.write_address_file()
        (tmp_path / "victim").mkdir()
        (tmp_path / "planted").symlink_to(tmp_path / "victim")
        args = build_parser().parse_args(["--campaign", str(tmp_path / "c"), "--job-id", JOB, "--node", "n1",
                                          "--slot-dir", str(tmp_path / "planted")])
        with pytest.raises(ConfigError) as err:
            agent_from_args(args)
        line = err.value.one_line()
        assert "planted" in line and "unsafe" in line and "\n" not in line and err.value.exit_code == 3
    finally:
        server.close()

"""The restart order file between the supervisor's agent and ranks restarting in process: what is written is read
back, nothing outside the rendezvous and resume variables can be set, and any bytes parse or raise OrderError."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.checkpoint import memory
from supervisor.client.restart_order import (
    ENV_GENERATION,
    ORDER_ENV,
    OrderError,
    RestartOrder,
    order_path,
    parse_order,
    read_order,
    write_order,
)
from supervisor.client.rollback import ENV_SKIP_STEPS
from supervisor.driver.launcher import RESUME_ENV


def test_an_order_written_is_read_back_private_and_whole(tmp_path: Path) -> None:
    order = RestartOrder(3, {"MASTER_PORT": "23456", "SUPERVISOR_RESUME_FROM": "/ckpt/step-40", "SUPERVISOR_SKIP_STEPS": None})
    path = write_order(tmp_path, order)
    assert path == order_path(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_order(tmp_path) == order
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left


def test_applying_an_order_sets_unsets_and_records_the_generation() -> None:
    environ = {"MASTER_PORT": "1", "SUPERVISOR_SKIP_STEPS": "5-9", "PATH": "/bin"}
    RestartOrder(2, {"MASTER_PORT": "29000", "SUPERVISOR_SKIP_STEPS": None}).apply(environ)
    assert environ == {"MASTER_PORT": "29000", "PATH": "/bin", ENV_GENERATION: "2"}


def test_the_names_an_order_may_set_are_the_launchers_resume_and_rendezvous_variables() -> None:
    launcher_names = {RESUME_ENV, ENV_SKIP_STEPS, memory.RESUME_STEP_ENV, memory.RESUME_LAUNCH_ENV,
                      memory.RESUME_FLUSHED_ENV, memory.LAUNCH_ENV, "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE"}  # fmt: skip
    assert launcher_names <= ORDER_ENV
    assert not {"LD_PRELOAD", "PATH", "PYTHONPATH", "SUPERVISOR_SLOT_DIR", "RANK"} & ORDER_ENV


@pytest.mark.parametrize(
    "doc, problem",
    [
        ({"v": 1, "generation": 1, "env": {"LD_PRELOAD": "/tmp/evil.so"}}, "may not set"),
        ({"v": 1, "generation": 0}, "generation"),
        ({"v": 1, "generation": True}, "generation"),
        ({"v": 1, "generation": 2**31}, "generation"),
        ({"v": 1, "generation": "2"}, "generation"),
        ({"v": 2, "generation": 1}, "version"),
        ({"v": 1, "generation": 1, "env": ["MASTER_PORT"]}, "not an object"),
        ({"v": 1, "generation": 1, "env": {"MASTER_PORT": 29000}}, "not a string"),
        ({"v": 1, "generation": 1, "env": {"MASTER_ADDR": "a\0b"}}, "not a string"),
        ([1], "version"),
    ],
)
def test_bad_orders_are_refused_by_name(tmp_path: Path, doc: object, problem: str) -> None:
    data = json.dumps(doc).encode()
    with pytest.raises(OrderError, match=problem):
        parse_order(data)
    order_path(tmp_path).write_bytes(data)
    assert read_order(tmp_path) is None  # a rank waiting on it treats it as no order


def test_oversized_and_undecodable_orders_are_refused(tmp_path: Path) -> None:
    with pytest.raises(OrderError, match="bytes"):
        parse_order(b" " * (70 * 1024))
    with pytest.raises(OrderError, match="not JSON"):
        parse_order(b"\xff\xfe{")
    with pytest.raises(OrderError, match="not JSON"):
        parse_order(b"[" * 60_000)
    assert read_order(tmp_path) is None  # no file


def test_an_order_that_could_not_be_read_back_is_never_written(tmp_path: Path) -> None:
    with pytest.raises(OrderError):
        write_order(tmp_path, RestartOrder(1, {"PYTHONPATH": "/tmp"}))
    assert not order_path(tmp_path).exists()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_any_bytes_parse_or_raise_order_error(data: bytes) -> None:
    try:
        parse_order(data)
    except OrderError:
        pass


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                     max_size=3), max_leaves=10)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["v", "generation", "env", "x"]), json_values, max_size=4),
       st.dictionaries(st.sampled_from(sorted(ORDER_ENV) + ["HOME"]), json_values, max_size=3))  # fmt: skip
def test_any_json_parses_to_a_checked_order_or_raises_order_error(doc: dict[str, object], env: dict[str, object]) -> None:
    if env:
        doc = {**doc, "env": env}
    try:
        order = parse_order(json.dumps(doc).encode())
    except OrderError:
        return
    assert 1 <= order.generation < 2**31
    assert set(order.env) <= ORDER_ENV
    assert all(v is None or isinstance(v, str) for v in order.env.values())
    environ: dict[str, str] = {}
    order.apply(environ)
    assert os.environ is not environ and environ[ENV_GENERATION] == str(order.generation)


def test_a_standbys_assignment_may_set_the_ranks_identity_a_restart_order_may_not(tmp_path: Path) -> None:
    from supervisor.client.restart_order import ASSIGN_ENV

    identity = RestartOrder(2, {"RANK": "5", "LOCAL_RANK": "1", "MASTER_PORT": "24000"})
    with pytest.raises(OrderError, match="may not set 'LOCAL_RANK'|may not set 'RANK'"):
        write_order(tmp_path, identity)
    path = write_order(tmp_path, identity, name="standby-s1.assign", allowed=ASSIGN_ENV)
    assert path.name == "standby-s1.assign" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_order(tmp_path, "standby-s1.assign", ASSIGN_ENV) == identity
    assert read_order(tmp_path, "standby-s1.assign") is None  # read as a restart order: refused
    assert not {"LD_PRELOAD", "PATH", "PYTHONPATH", "SUPERVISOR_SLOT_DIR"} & ASSIGN_ENV

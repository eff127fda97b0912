"""The site service's API (supervisor/site/server.py) in process, then over a real loopback HTTP server with the
campaigns' client (supervisor/site/client.py): a user's hardware verdict keeps another user's campaign off the
node and printed-text verdicts do not; the signer, not the body, says whose verdict it is; bad bodies get a 400
naming the field and store nothing; only operators forgive; a service that is down is "unknown", never "no node"."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.errors import ConfigError
from supervisor.site.auth import new_token, sign
from supervisor.site.client import Credentials, SiteClient, SiteUnavailable, read_token_file, write_token_file
from supervisor.site.server import SiteApi, make_server
from supervisor.site.store import SiteStore

NOW = 1_800_000_000.0
TOKENS = {"alice": new_token(), "bob": new_token(), "ops": new_token()}


def api(tmp_path: Path) -> SiteApi:
    store = SiteStore(tmp_path / "site")
    for user, token in TOKENS.items():
        store.set_token(user, token, admin=user == "ops", t=NOW)
    return SiteApi(store, clock=lambda: NOW)


def call(a: SiteApi, user: str, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    raw = b"" if body is None else json.dumps(body).encode()
    return a.handle(method, path, sign(user, TOKENS[user], method, path, raw, now=NOW), raw)


def verdict(**change: object) -> dict:
    return {"node": "node3", "source": "node", "klass": "hardware", "confidence": 0.9,
            "evidence": ["Xid 79: GPU fell off the bus"], "job": "17", "campaign": "alice-llm", **change}  # fmt: skip


def test_hardware_read_from_the_node_crosses_users_printed_text_does_not(tmp_path: Path) -> None:
    a = api(tmp_path)
    assert call(a, "alice", "POST", "/v1/verdicts", verdict())[0] == 200
    assert call(a, "alice", "POST", "/v1/verdicts", verdict(node="node4", source="program"))[0] == 200
    status, answer = call(a, "bob", "GET", "/v1/excluded")
    assert status == 200 and [n["node"] for n in answer["nodes"]] == ["node3"]
    assert [n["node"] for n in call(a, "alice", "GET", "/v1/excluded")[1]["nodes"]] == ["node3", "node4"]


def test_the_signer_owns_the_verdict_whatever_the_body_says(tmp_path: Path) -> None:
    a = api(tmp_path)
    call(a, "alice", "POST", "/v1/verdicts", verdict(source="program", user="bob"))
    assert call(a, "bob", "GET", "/v1/excluded")[1]["nodes"] == []
    assert [v.user for v in a.store.verdicts()] == ["alice"]


@pytest.mark.parametrize(("change", "field"), [({"node": "node3; rm -rf /"}, "node"), ({"source": "rumour"}, "source"),
                                               ({"confidence": 7}, "confidence"), ({"evidence": "x"}, "evidence"),
                                               ({"campaign": ""}, "campaign")])  # fmt: skip
def test_a_bad_field_is_named_and_nothing_is_stored(tmp_path: Path, change: dict, field: str) -> None:
    a = api(tmp_path)
    status, answer = call(a, "alice", "POST", "/v1/verdicts", verdict(**change))
    assert status == 400 and f"'{field}'" in answer["error"]
    assert a.store.verdicts() == []


def test_only_operators_forgive_and_forgiveness_returns_the_node(tmp_path: Path) -> None:
    a = api(tmp_path)
    call(a, "alice", "POST", "/v1/verdicts", verdict())
    assert call(a, "bob", "POST", "/v1/forgive", {"node": "node3"})[0] == 403
    a.clock = lambda: NOW + 10
    a.verifier.clock = a.clock
    raw = json.dumps({"node": "node3"}).encode()
    assert a.handle("POST", "/v1/forgive", sign("ops", TOKENS["ops"], "POST", "/v1/forgive", raw, now=NOW + 10),
                    raw)[0] == 200  # fmt: skip
    assert a.handle("GET", "/v1/excluded", sign("bob", TOKENS["bob"], "GET", "/v1/excluded", b"", now=NOW + 10),
                    b"")[1]["nodes"] == []  # fmt: skip


def test_job_events_give_the_lemon_rule_its_node_hours(tmp_path: Path) -> None:
    a = api(tmp_path)
    assert call(a, "alice", "POST", "/v1/jobs", {"job": "17", "nodes": ["node1", "node2"], "campaign": "c",
                                                 "event": "start"})[0] == 200  # fmt: skip
    assert set(a.store.exposure_h(NOW - 10, NOW + 3600)) == {"node1", "node2"}
    assert call(a, "alice", "POST", "/v1/jobs", {"job": "17", "nodes": ["node1"], "campaign": "c",
                                                 "event": "restart"})[0] == 400  # fmt: skip


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(st.one_of(st.binary(max_size=200), st.dictionaries(st.text(max_size=10), st.none() | st.integers() |
                                                          st.text(max_size=20) | st.lists(st.integers()), max_size=8)))
def test_any_body_gets_an_answer_never_an_exception(tmp_path: Path, body: bytes | dict) -> None:
    a = api(tmp_path)
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    for path in ("/v1/verdicts", "/v1/jobs", "/v1/forgive"):
        status, answer = a.handle("POST", path, sign("alice", TOKENS["alice"], "POST", path, raw, now=NOW), raw)
        assert status in (200, 400, 403) and isinstance(answer, dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_over_http_with_the_campaigns_client_and_a_private_token_file(tmp_path: Path) -> None:
    a = api(tmp_path)
    port = free_port()
    server = make_server(a, "127.0.0.1", port)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    a.clock = a.verifier.clock = time.time  # real clocks on both sides now
    try:
        token_file = tmp_path / "alice.token"
        write_token_file(token_file, Credentials("alice", TOKENS["alice"]))
        alice = SiteClient(f"http://127.0.0.1:{port}", read_token_file(token_file))
        alice.post_verdict(node="node3", source="node", klass="hardware", confidence=0.9, evidence=["Xid 79"],
                           job="17", campaign="alice-llm")  # fmt: skip
        bob = SiteClient(f"http://127.0.0.1:{port}", Credentials("bob", TOKENS["bob"]))
        assert [n for n, _ in bob.excluded()] == ["node3"]
        forger = SiteClient(f"http://127.0.0.1:{port}", Credentials("bob", new_token()))
        with pytest.raises(SiteUnavailable, match="401"):
            forger.excluded()
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(SiteUnavailable, match="cannot be asked"):
        bob.excluded()  # the service is down: unknown, not "no bad node"


def test_a_token_file_others_can_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t"
    path.write_text(f"alice:{TOKENS['alice']}\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        read_token_file(path)
    path.chmod(0o600)
    path.write_text("alice\n")
    with pytest.raises(ConfigError, match="not USER:TOKEN"):
        read_token_file(path)


def test_submit_leaves_out_what_the_site_holds_and_never_fails_for_it(tmp_path: Path, capsys) -> None:
    """`supervise submit` with [site]: --exclude of the held nodes; the user's own --exclude kept (with a note);
    a site that cannot be asked: the flags as they were, with a note (supervisor/commands/submit.py)."""
    from supervisor.commands.submit import with_site_exclusions

    a = api(tmp_path)
    call(a, "alice", "POST", "/v1/verdicts", verdict(node="node3"))
    call(a, "alice", "POST", "/v1/verdicts", verdict(node="node4"))
    port = free_port()
    server = make_server(a, "127.0.0.1", port)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    a.clock = a.verifier.clock = time.time
    token_file = tmp_path / "bob.token"
    write_token_file(token_file, Credentials("bob", TOKENS["bob"]))
    site = {"url": f"http://127.0.0.1:{port}", "token_file": str(token_file)}
    try:
        assert with_site_exclusions(["-N", "2"], site) == (["-N", "2", "--exclude=node[3-4]"], ["node3", "node4"])
        assert with_site_exclusions(["-x", "node9"], site) == (["-x", "node9"], [])
        assert "your own --exclude is kept" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
    assert with_site_exclusions(["-N", "2"], site) == (["-N", "2"], [])
    assert "submitting without the site's exclusions" in capsys.readouterr().err
    assert with_site_exclusions(["-N", "2"], {}) == (["-N", "2"], [])


def test_a_flood_of_idle_connections_cannot_take_the_service(tmp_path: Path) -> None:
    a = api(tmp_path)
    server = make_server(a, "127.0.0.1", 0, max_connections=2, timeout_s=3.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = server.server_address[:2]
    try:
        idle = [socket.create_connection(address) for _ in range(2)]  # hold both slots, sending nothing
        time.sleep(0.3)
        extra = socket.create_connection(address)
        extra.settimeout(5)
        assert extra.recv(1) == b""  # closed at once: no slot
        for s in idle:  # while the idle ones still hold theirs
            s.setblocking(False)
            with pytest.raises(BlockingIOError):
                s.recv(1)
        for s in idle:
            s.settimeout(5)
            assert s.recv(1) == b""  # dropped after the timeout: the slots come back
        a.clock = a.verifier.clock = time.time
        bob = SiteClient(f"http://{address[0]}:{address[1]}", Credentials("bob", TOKENS["bob"]))
        assert bob.excluded() == []
    finally:
        server.shutdown()
        server.server_close()

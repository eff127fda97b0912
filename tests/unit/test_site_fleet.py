"""The fleet view of the site service (supervisor/site/fleet.py, fleet_metrics.py, page.py; the API in server.py):
campaigns post their figures and interruptions, and operators read them back as the fleet document, the
Prometheus page and the Grafana dashboard built on it; what a campaign may post is checked field by field; a
browser's read-only view key opens the two reads and nothing else, and stops working when it expires or its
token is replaced; the page's own files carry no data and a policy that runs no script but the service's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_site_api import NOW, TOKENS, api, call  # the same service in process, alice/bob/ops tokens

from supervisor import cli
from supervisor.decisions.lemon import LemonScore
from supervisor.decisions.site_trust import SiteVerdict
from supervisor.site.auth import new_token, sign, view_key
from supervisor.site.client import Credentials, write_token_file
from supervisor.site.fleet import Attempt, CampaignStatus, Interrupted, buckets, fleet_view, repair_states
from supervisor.site.fleet_metrics import NAMES as FLEET_NAMES
from supervisor.site.server import SiteApi

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "site-fleet.json"


def status(**change: object) -> dict:
    return {"campaign": "/scratch/alice/llm", "job": "41", "state": "running", "reason": "", "wall_s": 7200.0,
            "productive_s": 6480.0, "ettr": 0.9,
            "attempts": [{"start": NOW - 7200, "end": NOW - 3600, "klass": "hardware", "blamed": ["node3"]},
                         {"start": NOW - 3500, "end": None, "klass": None, "blamed": []}], **change}  # fmt: skip


def populated(tmp_path: Path) -> SiteApi:
    a = api(tmp_path)
    assert call(a, "alice", "POST", "/v1/campaigns", status())[0] == 200
    assert call(a, "alice", "POST", "/v1/interruptions", {"campaign": "/scratch/alice/llm", "job": "41",
                                                          "klass": "hardware", "nodes": ["node3"]})[0] == 200
    assert call(a, "alice", "POST", "/v1/interruptions", {"campaign": "/scratch/alice/llm", "job": "41",
                                                          "klass": "preemption", "nodes": []})[0] == 200
    assert call(a, "alice", "POST", "/v1/verdicts", {"node": "node3", "source": "node", "klass": "hardware",
                                                     "confidence": 0.9, "evidence": ["Xid 79"], "job": "41",
                                                     "campaign": "/scratch/alice/llm"})[0] == 200  # fmt: skip
    a.store.add_repair(NOW - 60, "node3", "drain", "supervise-site: Xid 79")
    return a


def test_a_campaigns_figures_and_interruptions_come_back_as_the_fleet(tmp_path: Path) -> None:
    a = populated(tmp_path)
    code, fleet = call(a, "ops", "GET", "/v1/fleet")
    assert code == 200
    [c] = fleet["campaigns"]
    assert (c["user"], c["state"], c["ettr"], c["job"]) == ("alice", "running", 0.9, "41")
    assert c["last_interruption"]["class"] == "preemption"  # the newest, whatever its class
    assert [x["klass"] for x in c["attempts"]] == ["hardware", None]
    [node] = [n for n in fleet["nodes"] if n["node"] == "node3"]
    assert node["repair"]["state"] == "drained" and node["verdicts"][0]["source"] == "node"
    hour = [b for b in fleet["interruptions"]["buckets"] if b["counts"]]
    assert hour[-1]["counts"] == {"hardware": 1, "preemption": 1}
    assert fleet["colours"]["hardware"] != fleet["colours"]["preemption"]


def test_the_newest_status_replaces_the_last_and_the_signer_owns_it(tmp_path: Path) -> None:
    a = populated(tmp_path)
    call(a, "alice", "POST", "/v1/campaigns", status(state="completed", ettr=0.95, user="ops"))
    [c] = a.store.campaigns()
    assert (c.user, c.state, c.ettr) == ("alice", "completed", 0.95)


def test_only_operators_read_the_fleet(tmp_path: Path) -> None:
    a = populated(tmp_path)
    code, answer = call(a, "alice", "GET", "/v1/fleet")
    assert code == 403 and "operators" in answer["error"]


@pytest.mark.parametrize(("change", "field"), [
    ({"ettr": 1.5}, "ettr"), ({"wall_s": float("nan")}, "wall_s"), ({"wall_s": -1}, "wall_s"),
    ({"attempts": [{"start": 1.0, "end": None, "klass": None, "blamed": ["n1; rm -rf /"]}]}, "node"),
    ({"attempts": [{"start": 1.0, "end": None}] * 101}, "attempts"), ({"state": ""}, "state"),
    ({"reason": "x" * 501}, "reason")])  # fmt: skip
def test_a_bad_status_field_is_named_and_nothing_is_stored(tmp_path: Path, change: dict, field: str) -> None:
    a = api(tmp_path)
    raw = json.dumps(status(**change)).encode()  # (NaN leaves Python's encoder as a bare NaN: not JSON either)
    code, answer = a.handle("POST", "/v1/campaigns", sign("alice", TOKENS["alice"], "POST", "/v1/campaigns", raw,
                                                          now=NOW), raw)  # fmt: skip
    assert code == 400 and (f"'{field}'" in answer["error"] or "JSON" in answer["error"]), answer
    assert a.store.campaigns() == []


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=60)
@given(st.dictionaries(st.sampled_from(["campaign", "job", "state", "klass", "nodes", "attempts", "ettr", "wall_s",
                                        "productive_s", "reason", "x"]),
                       st.none() | st.integers() | st.floats() | st.text(max_size=12) | st.lists(
                           st.none() | st.text(max_size=8) | st.dictionaries(st.text(max_size=6), st.integers() |
                                                                             st.text(max_size=6)), max_size=3),
                       max_size=11))  # fmt: skip
def test_any_campaign_body_gets_an_answer_never_an_exception(tmp_path: Path, body: dict) -> None:
    a = api(tmp_path)
    raw = json.dumps(body).encode()
    for path in ("/v1/campaigns", "/v1/interruptions"):
        code, answer = a.handle("POST", path, sign("alice", TOKENS["alice"], "POST", path, raw, now=NOW), raw)
        assert code in (200, 400) and isinstance(answer, dict)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_view_key_opens_the_fleet_reads_and_nothing_else(tmp_path: Path) -> None:
    a = populated(tmp_path)
    key = view_key("ops", TOKENS["ops"], NOW + 3600)
    assert a.handle("GET", "/v1/fleet", bearer(key), b"")[0] == 200
    code, body, headers = a.answer("GET", "/metrics", bearer(key), b"")
    assert code == 200 and headers["Content-Type"].startswith("text/plain") and b"supervise_site_node_lemon" in body
    for method, path in (("GET", "/v1/excluded"), ("GET", "/v1/nodes"), ("POST", "/v1/forgive")):
        assert a.handle(method, path, bearer(key), b"")[0] == 401, path  # a key is no signature
    assert a.handle("GET", "/v1/fleet", bearer(view_key("alice", TOKENS["alice"], NOW + 60)), b"")[0] == 403


@pytest.mark.parametrize("why", ["expired", "forged", "replaced token", "malformed", "not bearer"])
def test_a_bad_view_key_is_refused_with_a_reason(tmp_path: Path, why: str) -> None:
    a = populated(tmp_path)
    key = view_key("ops", TOKENS["ops"], NOW + 3600)
    headers = {
        "expired": bearer(view_key("ops", TOKENS["ops"], NOW - 1)),
        "forged": bearer(view_key("ops", new_token(), NOW + 3600)),
        "replaced token": bearer(key),
        "malformed": bearer("ops.tomorrow.x"),
        "not bearer": {"Authorization": f"Basic {key}"},
    }[why]
    if why == "replaced token":
        a.store.set_token("ops", new_token(), admin=True, t=NOW)
    code, answer = a.handle("GET", "/v1/fleet", headers, b"")
    assert code == 401 and "(fix:" in answer["error"], answer
    assert a.answer("GET", "/metrics", headers, b"")[0] == 401


def test_the_page_files_carry_no_data_and_a_strict_policy(tmp_path: Path) -> None:
    a = populated(tmp_path)
    for path in ("/", "/fleet.js", "/fleet.css"):
        code, body, headers = a.answer("GET", path, {}, b"")
        assert code == 200 and b"alice" not in body and b"node3" not in body, path
        assert "script-src 'self'" in headers["Content-Security-Policy"] and "unsafe" not in headers[
            "Content-Security-Policy"]  # fmt: skip
    assert b"innerHTML" not in a.answer("GET", "/fleet.js", {}, b"")[1]  # untrusted text only as textContent


def exported_names(page: bytes) -> set[str]:
    """The sample names on a Prometheus text page (a counter's are NAME_total)."""
    return {m.group(1).decode() for m in re.finditer(rb"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", page, re.M)}


def test_every_grafana_panel_reads_metrics_the_service_exports(tmp_path: Path) -> None:
    a = populated(tmp_path)
    a.store.add_repair(NOW - 30, "node7", "reboot", "supervise-site: Xid 79")
    a.store.job_started("40", [f"node{i}" for i in range(1, 9)], user="alice", campaign="c", t=NOW - 2 * 86400)
    page = a.answer("GET", "/metrics", bearer(view_key("ops", TOKENS["ops"], NOW + 60)), b"")[1]
    names = exported_names(page)
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\bsupervise_[a-z_]+", target["expr"]))
            assert used and used <= names, (panel["title"], used - names)
    assert {n for n in names if n.startswith("supervise_site_")} == {
        "supervise_site_interruptions_total", *(n for n in FLEET_NAMES if n != "supervise_site_interruptions")}


def test_site_url_prints_a_key_the_service_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = populated(tmp_path)
    a.clock = __import__("time").time  # the key is made against the real clock
    token_file = tmp_path / "ops.token"
    write_token_file(token_file, Credentials("ops", TOKENS["ops"]))
    assert cli.main(["site", "url", "--url", "http://admin1:8787/", "--token-file", str(token_file), "--days", "1"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed.startswith("http://admin1:8787/#key=ops.")
    assert a.handle("GET", "/v1/fleet", bearer(printed.split("#key=", 1)[1]), b"")[0] == 200
    assert cli.main(["site", "url", "--url", "http://x", "--token-file", str(token_file), "--days", "0"]) != 0


def test_repair_states_follow_the_loops_last_step_that_slurm_took() -> None:
    steps = [{"t": 1, "node": "n1", "kind": "drain", "reason": "r", "error": None},
             {"t": 2, "node": "n1", "kind": "reboot", "reason": "r", "error": None},
             {"t": 3, "node": "n2", "kind": "drain", "reason": "r", "error": None},
             {"t": 4, "node": "n2", "kind": "reboot", "reason": "r", "error": "no RebootProgram"},
             {"t": 5, "node": "n3", "kind": "drain", "reason": "r", "error": None},
             {"t": 6, "node": "n3", "kind": "resume", "reason": "r", "error": None},
             {"t": 7, "node": "n4", "kind": "wait", "reason": "r", "error": None}]  # fmt: skip
    assert {n: s["state"] for n, s in repair_states(steps).items()} == {"n1": "rebooting", "n2": "drained",
                                                                        "n3": "returned"}  # fmt: skip


def test_buckets_are_hours_for_two_days_and_days_beyond() -> None:
    hits = [Interrupted(NOW - 30, "u", "c", "1", "hang"), Interrupted(NOW - 90_000, "u", "c", "1", "hang"),
            Interrupted(NOW - 10**9, "u", "c", "1", "hang")]  # fmt: skip
    short = buckets(hits, NOW, window_s=86400)
    assert short["bucket_s"] == 3600 and sum(sum(b["counts"].values()) for b in short["buckets"]) == 1
    long = buckets(hits, NOW, window_s=30 * 86400)
    assert long["bucket_s"] == 86400 and 30 <= len(long["buckets"]) <= 31
    assert sum(sum(b["counts"].values()) for b in long["buckets"]) == 2  # the one outside the window is left out


def test_lemons_come_first_and_repaired_nodes_without_failures_are_listed() -> None:
    def score(node: str, failures: int, lemon: bool) -> LemonScore:
        return LemonScore(node, failures, 2, failures, 10.0, 1.0, 0.5, lemon, "why")

    doc = fleet_view(now=NOW, campaigns=[CampaignStatus("u", "c", "1", "running", "", 10, 9, 0.9,
                                                        (Attempt(NOW - 10, None, None),), NOW)],
                     scores=[score("n1", 5, False), score("n2", 3, True)], interruptions=[],
                     repairs=[{"t": NOW, "node": "n9", "kind": "drain", "reason": "r", "error": None}],
                     forgiven={}, verdicts=[SiteVerdict("n1", "u", "node", "hardware", "c", NOW)],
                     colours={"running": "#64b5f6"})  # fmt: skip
    assert [n["node"] for n in doc["nodes"]] == ["n2", "n1", "n9"]
    assert doc["nodes"][2]["repair"]["state"] == "drained" and doc["campaigns"][0]["last_interruption"] is None

"""The campaign's side of the site ledger (supervisor/driver/site_link.py) with an in-process fake service: asked
before each launch, told each blaming verdict with its evidence's source; an outage keeps the site's last answer,
is journaled once, and what waited goes out in order once the service is back; a refused request is dropped; and
the loop leaves the site's nodes out only when enough nodes remain (supervisor/driver/loop.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from supervisor.config import SiteConfig
from supervisor.decisions import events as ev
from supervisor.decisions.interruption import AGENT, PROGRAM, Interruption
from supervisor.decisions.placement import TrainingLayout
from supervisor.driver.context import Context
from supervisor.driver.loop import Supervisor
from supervisor.driver.site_link import SiteLink
from supervisor.site.client import SiteRefused, SiteUnavailable


class FakeSite:
    def __init__(self) -> None:
        self.up, self.held, self.got, self.refuse = True, ["node2"], [], False

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        if not self.up:
            raise SiteUnavailable("the site service at http://x cannot be asked (refused)", "start it")
        if self.refuse and method == "POST":
            raise SiteRefused("the site service refused POST /v1/verdicts: 400 field 'node'", "see")
        if method == "GET":
            return {"nodes": [{"node": n, "why": "x"} for n in self.held]}
        self.got.append((path, body))
        return {}


def link() -> tuple[SiteLink, FakeSite, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    site = FakeSite()
    return SiteLink(Context.of(events.append, clock=lambda: 100.0), site, "/c/llm", "77"), site, events


def hardware(node: str, witness: str) -> Interruption:
    return Interruption(ev.HARDWARE, (node,), 0.9, ("Xid 79",), witnesses=(witness,))


def test_asked_before_a_launch_and_told_each_blame_with_its_source() -> None:
    s, site, events = link()
    assert s.excluded(("node1", "node2", "node3")) == ("node2",)
    assert events[-1]["what"] == "excluded" and events[-1]["nodes"] == ["node2"]
    s.verdict(hardware("node3", AGENT))
    s.verdict(hardware("node1", PROGRAM))
    s.verdict(Interruption(ev.PREEMPTION, (), 1.0, ("preempted",)))  # nobody's fault: nothing told
    assert [(b["node"], b["source"], b["job"]) for _, b in site.got] == [("node3", "node", "77"),
                                                                        ("node1", "program", "77")]  # fmt: skip


def test_an_outage_keeps_the_last_answer_is_journaled_once_and_catches_up_in_order() -> None:
    s, site, events = link()
    s.excluded(("node1", "node2"))
    site.up = False
    assert s.excluded(("node1", "node2")) == ("node2",)  # the site's last word, not a guess
    s.job_started(("node1", "node2"))
    s.verdict(hardware("node1", AGENT))
    assert [e["what"] for e in events if e["what"] != "excluded"] == ["unavailable"]
    site.up = True
    s.excluded(("node1", "node2"))
    assert [p for p, _ in site.got] == ["/v1/jobs", "/v1/verdicts"]
    assert [e["what"] for e in events if e["what"] != "excluded"] == ["unavailable", "reachable"]


def test_a_refused_request_is_dropped_not_retried_forever() -> None:
    s, site, events = link()
    site.refuse = True
    s.verdict(hardware("node1", AGENT))
    site.refuse = False
    s.verdict(hardware("node3", AGENT))
    assert [b["node"] for _, b in site.got] == ["node3"] and events[0]["what"] == "refused"


def test_no_site_configured_does_nothing_and_bad_settings_are_journaled_not_fatal(tmp_path) -> None:
    events: list[dict[str, Any]] = []
    ctx = Context.of(events.append, clock=lambda: 1.0)
    assert SiteLink.from_config(ctx, SiteConfig(), "/c", "1").excluded(("node1",)) == () and events == []
    off = SiteLink.from_config(ctx, SiteConfig(url="http://x:1", token_file=str(tmp_path / "missing")), "/c", "1")
    assert off.client is None and events[0]["what"] == "off" and "cannot read the site token file" in events[0]["detail"]


def supervisor_with(held: list[str], nodes: tuple[str, ...], train: int) -> Supervisor:
    s, site, _ = link()
    site.held = held
    layout = TrainingLayout(nodes=nodes, tasks_per_node=1, spare_nodes=len(nodes) - train)
    parts = SimpleNamespace(site=s, layout=layout, nodeloss=SimpleNamespace(lost=set()), ctx=s.ctx)
    return Supervisor(parts)  # type: ignore[arg-type]


def test_the_loop_leaves_the_sites_nodes_out_only_when_enough_remain() -> None:
    assert supervisor_with(["node2"], ("node1", "node2", "node3"), 2).with_site_exclusions(()) == ("node2",)
    assert supervisor_with(["node2", "node3"], ("node1", "node2", "node3"), 2).with_site_exclusions(()) == ()
    assert supervisor_with(["node3"], ("node1", "node2", "node3"), 1).with_site_exclusions(("node1",)) == (
        "node1", "node3")  # fmt: skip


def report_at(now: float) -> dict[str, Any]:
    return {"state": "running", "reason": "", "goodput": {"wall_s": now, "productive_s": now / 2, "ettr": 0.5},
            "attempts": [{"start": 1.0, "end": 50.0, "outcome": {"class": "preemption", "blamed_nodes": []}},
                         {"start": 60.0, "end": None, "outcome": None}]}  # fmt: skip


def test_every_interruption_and_the_campaigns_figures_go_to_the_fleet_page() -> None:
    events: list[dict[str, Any]] = []
    clock = [100.0]
    site = FakeSite()
    s = SiteLink(Context.of(events.append, clock=lambda: clock[0]), site, "/c/llm", "77", report=report_at)
    s.job_started(("node1",))
    s.interrupted(Interruption(ev.PREEMPTION, (), 1.0, ("preempted",)))  # nobody's fault: told, blames nobody
    s.interrupted(hardware("node3", AGENT))
    paths = [p for p, _ in site.got]
    assert paths == ["/v1/jobs", "/v1/campaigns", "/v1/interruptions", "/v1/campaigns", "/v1/interruptions",
                     "/v1/verdicts", "/v1/campaigns"]  # fmt: skip
    assert [b["klass"] for p, b in site.got if p == "/v1/interruptions"] == ["preemption", "hardware"]
    figures = site.got[1][1]
    assert (figures["state"], figures["ettr"], figures["wall_s"]) == ("running", 0.5, 100.0)
    assert [a["klass"] for a in figures["attempts"]] == ["preemption", None]


def test_the_figures_are_refreshed_while_it_runs_and_never_wait_on_a_site_that_is_down() -> None:
    clock = [100.0]
    site = FakeSite()
    s = SiteLink(Context.of(lambda e: None, clock=lambda: clock[0]), site, "/c", "7", report=report_at)
    s.observe(None)
    clock[0] += 60
    s.observe(None)  # not yet due
    clock[0] += 300
    s.observe(None)
    assert [b["wall_s"] for p, b in site.got if p == "/v1/campaigns"] == [100.0, 460.0]
    site.up = False
    s.excluded(("node1",))  # finds the site down
    clock[0] += 600
    s.observe(None)  # no request: the next interruption or the run's end catches up
    assert s.pending == [] and s.down


class ExcludingSlurm:
    """Just what a requeue touches: the job (its ExcNodeList) and the two writes."""

    def __init__(self, excluded: tuple[str, ...]) -> None:
        from slurm.model import JobInfo

        self.info = JobInfo(job_id="7", state="RUNNING", base_state="RUNNING", nodes=("node1", "node2"),
                            batch_host="node1", excluded_nodes=excluded)  # fmt: skip
        self.calls: list[tuple[Any, ...]] = []

    def job(self, job_id: str) -> Any:
        return self.info

    def requeue(self, job_id: str) -> None:
        self.calls.append(("requeue",))

    def update_excluded_nodes(self, job_id: str, nodes: Any) -> None:
        self.calls.append(("update_excluded_nodes", list(nodes)))


def test_a_requeue_releases_what_submit_left_out_for_the_site_once_it_forgave_it(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """submit left node3 and node4 out for the site (ExcNodeList) and the user excluded node9; the site has since
    forgiven node3: the preemption's requeue takes node3 out of ExcNodeList, keeps node4 (still held) and node9
    (the user's), and keeps everything while the site's word is unknown."""
    import signal as signal_module

    from supervisor.driver.requeue import JobActions

    monkeypatch.setattr(signal_module, "signal", lambda *_: None)
    s, site, events = link()
    site.held = ["node4"]
    s.excluded(("node1", "node2"))  # the site's last answer, before the last launch
    slurm = ExcludingSlurm(("node3", "node4", "node9"))
    jobs = JobActions(s.ctx, slurm=slurm, channel=None, inbox=None, job_id="7", restart_count=0,  # type: ignore[arg-type]
                      scheduled_end=lambda: None, released=lambda: s.released(("node3", "node4"), ()))  # fmt: skip
    jobs.requeue(())  # a preemption: nobody's fault, nothing new to exclude
    assert slurm.calls == [("requeue",), ("update_excluded_nodes", ["node4", "node9"])]
    assert events[-1]["type"] == ev.NODES_EXCLUDED and events[-1]["released"] == ["node3"]

    assert s.released(("node3",), own=("node3",)) == frozenset()  # the campaign's own ledger still holds it
    site.up = False
    s.excluded(("node1",))
    assert s.released(("node3", "node4"), ()) == frozenset()  # the site is down: unknown is not forgiven
    slurm.calls.clear()
    jobs.requeue(())
    assert slurm.calls == [("requeue",)]  # ExcNodeList left as it is

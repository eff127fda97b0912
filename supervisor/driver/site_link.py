"""The campaign's side of the site-wide node ledger (docs/site.md): ask it before each launch, tell it each node
verdict, each interruption (whatever its class: the fleet page's picture over time), each Slurm run's nodes, and
the campaign's state and goodput (when the run starts and ends, after each interruption, and every
``STATUS_EVERY_S`` while the site is reachable). Polls and acts only; what counts for whom is the service's rule
(``decisions/site_trust.py``) and which evidence a verdict rests on is ``decisions/site_source.py``.

The service being down never stops a campaign: an ask that fails keeps the site's last answer (its word, not a
guess) and journals ``site unavailable`` once per outage; what could not be told waits in order and goes out with
the next request that gets through (``site reachable``). Without ``[site] url`` every call does nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from supervisor.decisions import events as ev
from supervisor.decisions.classify import NO_BLAME
from supervisor.decisions.interruption import Interruption
from supervisor.decisions.site_source import verdict_source
from supervisor.driver.context import Context
from supervisor.driver.guard import SITE
from supervisor.errors import SupervisorError

PENDING_MAX = 1000  # requests kept while the service is away (the oldest dropped beyond it)
STATUS_EVERY_S = 300.0  # the campaign's figures on the fleet page are at most this old while it runs


class SiteLink:
    def __init__(self, ctx: Context, client: Any, campaign: str, job_id: str,
                 report: Callable[[float], dict[str, Any]] | None = None) -> None:  # fmt: skip
        """``client``: a ``site.client.SiteClient``, or None (no site configured); ``report(now)``: the campaign's
        report (``campaign_state``), whose state and goodput go to the fleet page."""
        self.ctx, self.client, self.campaign, self.job_id, self.report = ctx, client, campaign, job_id, report
        self.status_at = float("-inf")
        self.held: tuple[str, ...] = ()  # the site's last answer
        self.answered = False  # whether the site has answered an ask in this run (else ``held`` is not its word)
        self.pending: list[tuple[str, str, dict[str, Any]]] = []
        self.down = False

    @classmethod
    def from_config(cls, ctx: Context, site: Any, campaign: str, job_id: str,
                    report: Callable[[float], dict[str, Any]] | None = None) -> SiteLink:  # fmt: skip
        """From ``[site]``; settings that cannot be used (the token file unreadable) are journaled, not fatal."""
        if not site.url:
            return cls(ctx, None, campaign, job_id, report)
        from supervisor.site.client import SiteClient, read_token_file

        try:
            client = SiteClient(site.url, read_token_file(Path(site.token_file).expanduser()), site.timeout_s)
        except SupervisorError as err:
            ctx.record(ev.site(ctx.clock(), "off", err.plain()))
            return cls(ctx, None, campaign, job_id, report)
        return cls(ctx, client, campaign, job_id, report)

    def _call(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any] | None:
        from supervisor.site.client import SiteRefused, SiteUnavailable

        try:
            answer = self.client.request(method, path, body)
        except SiteRefused as err:  # it answered: not an outage, and this request will never be taken
            self.ctx.record(ev.site(self.ctx.clock(), "refused", err.plain()))
            return {}
        except SiteUnavailable as err:
            if not self.down:
                self.down = True
                self.ctx.record(ev.site(self.ctx.clock(), "unavailable", err.plain()))
            return None
        if self.down:
            self.down = False
            self.ctx.record(ev.site(self.ctx.clock(), "reachable", f"{len(self.pending)} waiting request(s) sent"))
        return answer if isinstance(answer, dict) else {}

    def _flush(self) -> bool:
        while self.pending:
            method, path, body = self.pending[0]
            if self._call(method, path, body) is None:
                return False
            self.pending.pop(0)
        return True

    def _tell(self, path: str, body: dict[str, Any]) -> None:
        if self.client is None:
            return
        self.pending.append(("POST", path, body))
        del self.pending[:-PENDING_MAX]
        self._flush()

    def excluded(self, nodes: Sequence[str]) -> tuple[str, ...]:
        """Of ``nodes``, those the site holds as bad for this campaign's user (its last answer if it cannot be
        asked now); journaled when there are any."""
        if self.client is None:
            return ()
        # what waited first (in order); a site that did not take it is not asked again now (one timeout, not two)
        answer = self._call("GET", "/v1/excluded", None) if self._flush() else None
        if answer is not None:
            rows = answer.get("nodes")
            if isinstance(rows, list):
                self.answered = True
                self.held = tuple(sorted({r["node"] for r in rows if isinstance(r, dict) and isinstance(r.get("node"),
                                                                                                       str)}))  # fmt: skip
        here = tuple(n for n in nodes if n in self.held)
        if here:
            self.ctx.record(ev.site(self.ctx.clock(), "excluded", "the site ledger holds them as bad", here))
        return here

    def released(self, submitted: Sequence[str], own: Sequence[str]) -> frozenset[str]:
        """Of the nodes ``submit`` left out for the site (``submitted``), those the site no longer holds as bad in
        its last answer, less the campaign's own exclusions (``own``): a requeue takes them out of the job's
        ExcNodeList. Nothing while the site is down or has not answered in this run: unknown is not forgiven."""
        if self.client is None or self.down or not self.answered:
            return frozenset()
        return frozenset(submitted) - set(self.held) - set(own)

    def interrupted(self, interruption: Interruption) -> None:
        """Tell the site of this interruption (every class), of each node it blames, and the campaign's figures."""
        self._tell("/v1/interruptions", {"campaign": self.campaign[:256], "job": self.job_id or "-",
                                         "klass": interruption.cls, "nodes": list(interruption.blamed_nodes)})
        self.verdict(interruption)
        self.status()

    def verdict(self, interruption: Interruption) -> None:
        """Tell the site about each node this interruption blames."""
        if interruption.cls in NO_BLAME or not interruption.blamed_nodes:
            return
        source = verdict_source(interruption)
        for node in interruption.blamed_nodes:
            self._tell("/v1/verdicts", {"node": node, "source": source, "klass": interruption.cls,
                                        "confidence": max(0.0, min(1.0, float(interruption.confidence))),
                                        "evidence": [line[:1000] for line in interruption.evidence[:20]],
                                        "job": self.job_id, "campaign": self.campaign[:256]})  # fmt: skip

    def status(self) -> None:
        """The campaign's state, goodput and newest launches, as its report has them now."""
        if self.client is None or self.report is None:
            return
        from supervisor.site.fleet import status_from_report

        now = self.ctx.clock()
        self.status_at = now
        s = status_from_report(self.report(now), user="-", campaign=self.campaign[:256], job=self.job_id or "-", t=now)
        self._tell("/v1/campaigns", {
            "campaign": s.campaign, "job": s.job, "state": s.state[:32], "reason": s.reason[:500], "wall_s": s.wall_s,
            "productive_s": s.productive_s, "ettr": None if s.ettr is None else max(0.0, min(1.0, float(s.ettr))),
            "attempts": [{"start": a.start, "end": a.end, "klass": a.klass, "blamed": list(a.blamed)}
                         for a in s.attempts]})  # fmt: skip

    def observe(self, live: Any) -> None:
        """Each watch pass (an observer): the figures every ``STATUS_EVERY_S``, only while the site answers (a
        site that is down costs the loop no timeout here; the next interruption or the run's end catches up)."""
        if self.client is not None and not self.down and self.ctx.clock() - self.status_at >= STATUS_EVERY_S:
            self.status_at = self.ctx.clock()  # (once per period even when it fails: no retry every pass)
            self.ctx.guard.call(SITE, self.status, default=None)  # its own stage: never the detector's pass

    def job_started(self, nodes: Sequence[str]) -> None:
        self._tell("/v1/jobs", {"job": self.job_id, "nodes": list(nodes), "campaign": self.campaign[:256],
                                "event": "start"})  # fmt: skip
        self.status()

    def job_ended(self, nodes: Sequence[str]) -> None:
        self._tell("/v1/jobs", {"job": self.job_id, "nodes": list(nodes), "campaign": self.campaign[:256],
                                "event": "end"})  # fmt: skip
        self.status()

"""The site service's HTTP API (issue 24): campaigns post their node verdicts and jobs, and ask which nodes to
leave out; operators list the nodes and forgive one after a repair.

Every request is signed (``site/auth.py``); the user a verdict counts for is the one whose token signed it, never
a name in the body. Bodies are JSON of at most 64 KiB, checked field by field; a bad one is answered 400 with one
line naming the field, an unauthentic one 401, an operator's action asked by a user 403; nothing is stored then.

    POST /v1/verdicts   {"node", "source", "klass", "confidence", "evidence": [...], "job", "campaign"}
    POST /v1/jobs       {"job", "nodes": [...], "campaign", "event": "start" | "end"}
    GET  /v1/excluded   -> {"nodes": [{"node", "why"}]}   the signer's next launch leaves these out
    GET  /v1/nodes      -> {"nodes": [lemon score, ...]}
    POST /v1/forgive    {"node"}                          operators only
    POST /v1/campaigns  {"campaign", "job", "state", "reason", "wall_s", "productive_s", "ettr", "attempts": [...]}
    POST /v1/interruptions {"campaign", "job", "klass", "nodes": [...]}
    GET  /v1/job-state?job=ID -> the service's newest Slurm read of that job (site/job_watch.py)
    GET  /v1/fleet      -> the fleet page's document (site/fleet.py)    operators; a view key will do
    GET  /metrics       -> the same figures for Prometheus               operators; a view key will do
    GET  /, /fleet.css, /fleet.js                                        the fleet page (no data in it)

The two reads a browser or a scraper makes may carry ``Authorization: Bearer VIEW_KEY`` instead of a signature
(``site/auth.py``: read-only, expiring). Connections beyond ``MAX_CONNECTIONS`` are closed at once and one that
sends nothing is dropped after ``TIMEOUT_S``: a flood or a stuck client cannot take the service's threads.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from slurm.hostlist import validate_job_id, validate_node_name
from supervisor.bounded_http import BoundedHTTPServer
from supervisor.decisions.lemon import LemonConfig, score_nodes
from supervisor.decisions.site_trust import SOURCES, SiteVerdict, excluded_for
from supervisor.plot.timeline import COLOURS
from supervisor.site import fleet as fleet_doc
from supervisor.site.auth import SiteAuthError, Verifier, verify_view_key
from supervisor.site.fleet import Attempt, CampaignStatus
from supervisor.site.page import CSP, PAGES
from supervisor.site.store import SiteStore

MAX_BODY = 64 * 1024
MAX_CONNECTIONS = 32
TIMEOUT_S = 10.0
VIEWABLE = ("/v1/fleet", "/metrics")  # the reads a view key opens


class BadRequest(Exception):
    """A request body or field the API does not accept (answered 400, one line)."""


def _text(body: dict[str, Any], key: str, limit: int = 256) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value or len(value) > limit or not value.isprintable():
        raise BadRequest(f"field {key!r} must be a printable string of 1-{limit} characters")
    return value


def _node(body: dict[str, Any], key: str = "node") -> str:
    value = _text(body, key, 128)
    try:
        return validate_node_name(value)
    except Exception:
        raise BadRequest(f"field {key!r} is not a node name: {value!r}") from None


class SiteApi:
    """The service's decisions over its store, one request at a time (the store is one SQLite connection)."""

    def __init__(self, store: SiteStore, clock: Callable[[], float] = time.time,
                 lemon: LemonConfig | None = None, job_watch: Any = None) -> None:  # fmt: skip
        """``job_watch``: a ``site.job_watch.JobWatch`` (None: the service reads no job; campaigns ask Slurm)."""
        self.store, self.clock, self.lemon, self.job_watch = store, clock, lemon or LemonConfig(), job_watch
        self.verifier = Verifier(store.token_of, clock)
        self.lock = threading.Lock()

    def handle(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            try:
                user = self._who(method, path, headers, raw)
            except SiteAuthError as err:
                return 401, {"error": err.plain()}
            try:
                body = self._body(raw) if method == "POST" else {}
                return self._route(method, path, user, body)
            except BadRequest as err:
                return 400, {"error": str(err)}

    def _who(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> str:
        bearer = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
        if bearer is not None and method == "GET" and path in VIEWABLE:
            scheme, _, key = bearer.partition(" ")
            if scheme.lower() != "bearer":
                raise SiteAuthError("the Authorization header is not a Bearer view key",
                                    "send `Authorization: Bearer KEY` with the key `supervise site url` printed")
            return verify_view_key(key.strip(), self.store.token_of, self.clock())
        return self.verifier.verify(headers, method, path, raw)

    def answer(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, bytes, dict[str, str]]:
        """The HTTP answer (status, body, headers): the fleet page's files, the metrics page, or the JSON API."""
        if method == "GET" and path in PAGES:
            body, kind = PAGES[path]
            return 200, body, {"Content-Type": kind, "Content-Security-Policy": CSP, "Cache-Control": "no-store",
                               "X-Content-Type-Options": "nosniff"}  # fmt: skip
        if method == "GET" and path == "/metrics":
            status, doc = self._metrics(headers, raw)
            if status == 200:
                return 200, doc, {"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
            return status, doc, {"Content-Type": "application/json"}
        status, answer = self.handle(method, path, headers, raw)
        return status, json.dumps(answer).encode(), {"Content-Type": "application/json"}

    def _metrics(self, headers: dict[str, str], raw: bytes) -> tuple[int, bytes]:
        with self.lock:
            try:
                user = self._who("GET", "/metrics", headers, raw)
            except SiteAuthError as err:
                return 401, json.dumps({"error": err.plain()}).encode()
            if not self.store.is_admin(user):
                return 403, json.dumps({"error": f"{user} may not read the fleet (fix: ask the site's operators)"
                                        }).encode()  # fmt: skip
            fleet, counts = self.fleet(self.clock()), self.store.interruption_counts()
        try:
            from supervisor.site.fleet_metrics import render
        except ImportError:
            return 501, json.dumps({"error": "prometheus-client is not installed on the service's host (fix: pip "
                                             "install 'slurm-supervisor[metrics]')"}).encode()  # fmt: skip
        return 200, render(fleet, counts)

    def fleet(self, now: float) -> dict[str, Any]:
        """The fleet document (``site/fleet.py``) from the store, now."""
        since = now - self.lemon.window_s
        return fleet_doc.fleet_view(now=now, campaigns=self.store.campaigns(), scores=self.scores(now),
                                    interruptions=self.store.interruptions(now - fleet_doc.INTERRUPTIONS_WINDOW_S),
                                    repairs=self.store.repairs(), forgiven=self.store.forgiven_at(),
                                    verdicts=self.store.verdicts(since), colours=COLOURS)  # fmt: skip

    @staticmethod
    def _body(raw: bytes) -> dict[str, Any]:
        try:
            body = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise BadRequest("the body is not JSON") from None
        if not isinstance(body, dict):
            raise BadRequest("the body must be a JSON object")
        return body

    def _route(self, method: str, path: str, user: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        now = self.clock()
        if (method, path) == ("POST", "/v1/verdicts"):
            source = _text(body, "source", 16)
            if source not in SOURCES:
                raise BadRequest(f"field 'source' must be one of {', '.join(SOURCES)}")
            confidence = body.get("confidence")
            if not isinstance(confidence, (int, float)) or not (math.isfinite(confidence) and 0 <= confidence <= 1):
                raise BadRequest("field 'confidence' must be a number between 0 and 1")
            evidence = body.get("evidence")
            if not isinstance(evidence, list) or len(evidence) > 20 or not all(
                    isinstance(e, str) and len(e) <= 1000 for e in evidence):  # fmt: skip
                raise BadRequest("field 'evidence' must be a list of at most 20 strings of at most 1000 characters")
            verdict = SiteVerdict(node=_node(body), user=user, source=source, klass=_text(body, "klass", 64),
                                  campaign=_text(body, "campaign"), t=now)  # fmt: skip
            row = self.store.add_verdict(verdict, confidence=float(confidence), evidence=evidence,
                                         job=_text(body, "job", 64))  # fmt: skip
            return 200, {"id": row}
        if (method, path) == ("POST", "/v1/jobs"):
            nodes = body.get("nodes")
            if not isinstance(nodes, list) or not 1 <= len(nodes) <= 100_000:
                raise BadRequest("field 'nodes' must be a list of 1 to 100000 node names")
            names = [_node({"node": n}) for n in nodes]
            job, event = _text(body, "job", 64), body.get("event")
            if event == "start":
                self.store.job_started(job, names, user=user, campaign=_text(body, "campaign"), t=now)
            elif event == "end":
                self.store.job_ended(job, now)
            else:
                raise BadRequest("field 'event' must be 'start' or 'end'")
            return 200, {}
        if (method, path) == ("GET", "/v1/excluded"):
            lemons = [s.node for s in self.scores(now) if s.lemon]
            found = excluded_for(user, self.store.verdicts(now - self.lemon.window_s), lemons,
                                 self.store.forgiven_at())  # fmt: skip
            return 200, {"nodes": [{"node": e.node, "why": e.why} for e in found]}
        if (method, path) == ("GET", "/v1/nodes"):
            return 200, {"nodes": [asdict(s) for s in self.scores(now)]}
        if (method, path) == ("POST", "/v1/forgive"):
            if not self.store.is_admin(user):
                return 403, {"error": f"{user} may not forgive nodes (fix: ask the site's operators)"}
            node = _node(body)
            self.store.forgive(node, now, by=user)
            return 200, {"node": node}
        if (method, path) == ("POST", "/v1/campaigns"):
            self.store.campaign_status(_campaign_status(body, user, now))
            return 200, {}
        if (method, path) == ("POST", "/v1/interruptions"):
            nodes = body.get("nodes")
            if not isinstance(nodes, list) or len(nodes) > 10_000:
                raise BadRequest("field 'nodes' must be a list of at most 10000 node names")
            self.store.add_interruption(now, user, _text(body, "campaign"), _text(body, "job", 64),
                                        _text(body, "klass", 64), [_node({"node": n}) for n in nodes])  # fmt: skip
            return 200, {}
        if method == "GET" and path.startswith("/v1/job-state?job="):
            try:
                job = validate_job_id(path.split("=", 1)[1])
            except Exception:
                raise BadRequest("the query must be ?job=ID with a Slurm job id") from None
            if self.job_watch is None:
                return 200, {"job": job, "read_at": None, "found": None, "watching": False}
            return 200, {**self.job_watch.answer(job), "watching": True}
        if (method, path) == ("GET", "/v1/fleet"):
            if not self.store.is_admin(user):
                return 403, {"error": f"{user} may not read the fleet (fix: ask the site's operators)"}
            return 200, self.fleet(now)
        return 404, {"error": f"no such endpoint: {method} {path}"}

    def scores(self, now: float) -> list[Any]:
        since = now - self.lemon.window_s
        return score_nodes(self.store.failures(since, now), self.store.exposure_h(since, now), now, self.lemon)


def _number(body: dict[str, Any], key: str, *, optional: bool = False) -> float | None:
    value = body.get(key)
    if value is None and optional:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise BadRequest(f"field {key!r} must be a finite number >= 0" + (" or null" if optional else ""))
    return float(value)


def _campaign_status(body: dict[str, Any], user: str, now: float) -> CampaignStatus:
    rows = body.get("attempts")
    if not isinstance(rows, list) or len(rows) > fleet_doc.ATTEMPTS_KEPT:
        raise BadRequest(f"field 'attempts' must be a list of at most {fleet_doc.ATTEMPTS_KEPT} launches")
    attempts = []
    for a in rows:
        if not isinstance(a, dict):
            raise BadRequest("each of 'attempts' must be an object {start, end, klass, blamed}")
        blamed = a.get("blamed")
        if not isinstance(blamed, list) or len(blamed) > 1000:
            raise BadRequest("an attempt's 'blamed' must be a list of at most 1000 node names")
        klass = None if a.get("klass") is None else _text(a, "klass", 64)
        attempts.append(Attempt(_number(a, "start") or 0.0, _number(a, "end", optional=True), klass,
                                tuple(_node({"node": n}) for n in blamed)))  # fmt: skip
    ettr = _number(body, "ettr", optional=True)
    if ettr is not None and ettr > 1:
        raise BadRequest("field 'ettr' must be between 0 and 1 or null")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > 500 or not (reason.isprintable() or not reason):
        raise BadRequest("field 'reason' must be a printable string of at most 500 characters")
    return CampaignStatus(user=user, campaign=_text(body, "campaign"), job=_text(body, "job", 64),
                          state=_text(body, "state", 32), reason=reason, wall_s=_number(body, "wall_s") or 0.0,
                          productive_s=_number(body, "productive_s") or 0.0, ettr=ettr, attempts=tuple(attempts),
                          t=now)  # fmt: skip


def make_server(api: SiteApi, host: str, port: int, max_connections: int = MAX_CONNECTIONS,
                timeout_s: float = TIMEOUT_S) -> ThreadingHTTPServer:  # fmt: skip
    class Handler(BaseHTTPRequestHandler):
        server_version = "slurm-supervisor-site/1"
        timeout = timeout_s  # a connection that sends nothing is dropped (socket timeout)

        def _answer(self, method: str) -> None:
            length = self.headers.get("Content-Length", "0")
            if not length.isdigit() or int(length) > MAX_BODY:
                self._send(413, json.dumps({"error": f"the body must be at most {MAX_BODY} bytes"}).encode(),
                           {"Content-Type": "application/json"})  # fmt: skip
                return
            raw = self.rfile.read(int(length)) if int(length) else b""
            self._send(*api.answer(method, self.path, {k: v for k, v in self.headers.items()}, raw))

        def _send(self, status: int, data: bytes, headers: dict[str, str]) -> None:
            self.send_response(status)
            for key, value in headers.items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._answer("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._answer("POST")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the store is the record
            pass

    return BoundedHTTPServer((host, port), Handler, max_connections)

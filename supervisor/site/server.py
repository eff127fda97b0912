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

from slurm.hostlist import validate_node_name
from supervisor.decisions.lemon import LemonConfig, score_nodes
from supervisor.decisions.site_trust import SOURCES, SiteVerdict, excluded_for
from supervisor.site.auth import SiteAuthError, Verifier
from supervisor.site.store import SiteStore

MAX_BODY = 64 * 1024


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
                 lemon: LemonConfig | None = None) -> None:  # fmt: skip
        self.store, self.clock, self.lemon = store, clock, lemon or LemonConfig()
        self.verifier = Verifier(store.token_of, clock)
        self.lock = threading.Lock()

    def handle(self, method: str, path: str, headers: dict[str, str], raw: bytes) -> tuple[int, dict[str, Any]]:
        with self.lock:
            try:
                user = self.verifier.verify(headers, method, path, raw)
            except SiteAuthError as err:
                return 401, {"error": err.plain()}
            try:
                body = self._body(raw) if method == "POST" else {}
                return self._route(method, path, user, body)
            except BadRequest as err:
                return 400, {"error": str(err)}

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
        return 404, {"error": f"no such endpoint: {method} {path}"}

    def scores(self, now: float) -> list[Any]:
        since = now - self.lemon.window_s
        return score_nodes(self.store.failures(since, now), self.store.exposure_h(since, now), now, self.lemon)


def make_server(api: SiteApi, host: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        server_version = "slurm-supervisor-site/1"

        def _answer(self, method: str) -> None:
            length = self.headers.get("Content-Length", "0")
            if not length.isdigit() or int(length) > MAX_BODY:
                self._send(413, {"error": f"the body must be at most {MAX_BODY} bytes"})
                return
            raw = self.rfile.read(int(length)) if int(length) else b""
            status, answer = api.handle(method, self.path, {k: v for k, v in self.headers.items()}, raw)
            self._send(status, answer)

        def _send(self, status: int, answer: dict[str, Any]) -> None:
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - http.server's names
            self._answer("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._answer("POST")

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet: the store is the record
            pass

    return ThreadingHTTPServer((host, port), Handler)

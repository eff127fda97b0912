"""A campaign's (or an operator's) side of the site service (issue 24): signed requests, typed answers.

A failed request is never an empty answer: ``excluded()`` raises ``SiteUnavailable`` when the service cannot be
asked (down, refusing, answering nonsense), and the caller goes on with its own ledger and says so; "the site holds
no bad node" is only ever the service's own answer.
"""

from __future__ import annotations

import json
import os
import stat
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from supervisor.errors import ConfigError, SiteError, SupervisorError
from supervisor.site.auth import sign, valid_user


class SiteUnavailable(SiteError):
    """The site service could not be asked, or refused the request."""


class SiteRefused(SiteUnavailable):
    """The service answered and refused this request (4xx): sending it again would not help."""


@dataclass(frozen=True)
class Credentials:
    user: str
    token: str


def read_token_file(path: Path | str) -> Credentials:
    """``USER:TOKEN`` as ``supervise site token`` writes it; the file must be private (0600 or stricter)."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
        text = path.read_text().strip()
    except OSError as err:
        raise ConfigError(f"cannot read the site token file {path} ({err.strerror})",
                          "set [site] token_file to the file `supervise site token` wrote for you") from None  # fmt: skip
    if mode & 0o077:
        raise ConfigError(f"the site token file {path} is readable by others (mode {mode:o})", f"chmod 600 {path}")
    user, _, token = text.partition(":")
    try:
        valid_user(user)
        bytes.fromhex(token)
        if len(token) != 64:
            raise ValueError
    except (SupervisorError, ValueError):
        raise ConfigError(f"the site token file {path} is not USER:TOKEN", "write it again with "
                          "`supervise site token --user NAME`") from None  # fmt: skip
    return Credentials(user, token)


class SiteClient:
    def __init__(self, url: str, credentials: Credentials, timeout_s: float = 5.0) -> None:
        self.url, self.credentials, self.timeout_s = url.rstrip("/"), credentials, timeout_s

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        raw = b"" if body is None else json.dumps(body).encode()
        headers = sign(self.credentials.user, self.credentials.token, method, path, raw)
        req = urllib.request.Request(self.url + path, data=raw if method == "POST" else None, method=method,
                                     headers={**headers, "Content-Type": "application/json"})  # fmt: skip
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as answer:  # noqa: S310 - the configured URL
                data = json.loads(answer.read(1 << 20))
        except urllib.error.HTTPError as err:
            try:
                why = json.loads(err.read(4096)).get("error", "")
            except (ValueError, AttributeError):
                why = ""
            if 400 <= err.code < 500 and why:  # the service's answer names the problem (and mostly its fix)
                fix = "" if "(fix:" in why else "check that [site] url names the site service, of this same version"
                raise SiteRefused(f"the site service refused {method} {path} ({err.code}): {why}", fix) from None
            kind = SiteRefused if 400 <= err.code < 500 else SiteUnavailable
            raise kind(f"the site service refused {method} {path}: {err.code}",
                       "see the service's log; a campaign goes on with its own ledger") from None  # fmt: skip
        except (OSError, ValueError) as err:
            raise SiteUnavailable(f"the site service at {self.url} cannot be asked ({err})",
                                  "start it (`supervise site serve`) or check [site] url; a campaign goes on with "
                                  "its own ledger") from None  # fmt: skip
        if not isinstance(data, dict):
            raise SiteUnavailable(f"the site service answered {method} {path} with something not an object",
                                  "check that [site] url names the site service")  # fmt: skip
        return data

    def excluded(self) -> list[tuple[str, str]]:
        """(node, why) for every node this user's next launch must leave out."""
        nodes = self.request("GET", "/v1/excluded").get("nodes")
        if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("node"), str)
                                                  and isinstance(n.get("why"), str) for n in nodes):  # fmt: skip
            raise SiteUnavailable("the site service's list of excluded nodes is malformed",
                                  "check that [site] url names the site service")  # fmt: skip
        return [(n["node"], n["why"]) for n in nodes]

    def post_verdict(self, *, node: str, source: str, klass: str, confidence: float, evidence: list[str], job: str,
                     campaign: str) -> None:  # fmt: skip
        self.request("POST", "/v1/verdicts", {"node": node, "source": source, "klass": klass,
                                              "confidence": confidence, "evidence": evidence[:20], "job": job,
                                              "campaign": campaign})  # fmt: skip

    def job_event(self, job: str, nodes: list[str], campaign: str, event: str) -> None:
        self.request("POST", "/v1/jobs", {"job": job, "nodes": nodes, "campaign": campaign, "event": event})


def write_token_file(path: Path, credentials: Credentials) -> None:
    """USER:TOKEN into a new 0600 file (never through a world-readable moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(f"{credentials.user}:{credentials.token}\n")

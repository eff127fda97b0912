"""Signed requests to the site service: who sent it, and that nobody forged, altered or replayed it (issue 24).

Each user holds a secret token (``supervise site token --user NAME`` issues it; the service keeps it in its 0600
database). A request carries the user, the time, a fresh nonce and an HMAC-SHA256 over all of them plus the
method, path and body, so:

* a request from someone without the user's token fails the MAC (forged);
* a changed path or body fails it too (altered);
* a request older than ``window_s`` (60 s) or whose nonce was already seen within the window is refused
  (replayed), so a captured request cannot post a verdict again or be sent to another path.

The MAC is checked before anything the sender chose is trusted; the user name only selects which secret to try.
Plain HTTP on purpose (the service runs on a login or admin node, stdlib only): this authenticates, it does not
hide; verdicts name nodes, not data.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections.abc import Callable, Mapping

from supervisor.errors import SiteError

WINDOW_S = 60.0
HEADERS = ("X-Site-User", "X-Site-Time", "X-Site-Nonce", "X-Site-Signature")
_USER = re.compile(r"[A-Za-z0-9._-]{1,64}")
_NONCE = re.compile(r"[0-9a-f]{32}")
_SIG = re.compile(r"[0-9a-f]{64}")


class SiteAuthError(SiteError):
    """A request to the site service is not authentic (forged, altered, replayed or malformed)."""


def new_token() -> str:
    return secrets.token_hex(32)


def valid_user(name: str) -> str:
    if not isinstance(name, str) or not _USER.fullmatch(name):
        raise SiteAuthError(f"invalid site user name {name!r}", "use letters, digits, '.', '_' or '-' (at most 64)")
    return name


def _mac(token: str, user: str, t: str, nonce: str, method: str, path: str, body: bytes) -> str:
    head = "\n".join(("slurm-supervisor site v1", user, t, nonce, method.upper(), path)).encode()
    return hmac.new(bytes.fromhex(token), head + b"\n" + body, hashlib.sha256).hexdigest()


def sign(user: str, token: str, method: str, path: str, body: bytes, now: float | None = None) -> dict[str, str]:
    """The headers that authenticate one request."""
    t = f"{time.time() if now is None else now:.3f}"
    nonce = secrets.token_hex(16)
    return dict(zip(HEADERS, (user, t, nonce, _mac(token, user, t, nonce, method, path, body)), strict=True))


class Verifier:
    def __init__(self, secret_of: Callable[[str], str | None], clock: Callable[[], float] = time.time,
                 window_s: float = WINDOW_S) -> None:  # fmt: skip
        """``secret_of(user)``: the user's token, None for an unknown user."""
        self.secret_of, self.clock, self.window_s = secret_of, clock, window_s
        self._seen: dict[str, float] = {}  # nonce -> its request's time, kept for the window
        self._lock = threading.Lock()

    def verify(self, headers: Mapping[str, str], method: str, path: str, body: bytes) -> str:
        """The authenticated user, or ``SiteAuthError`` saying why not."""
        lowered = {k.lower(): v for k, v in headers.items()}  # (header names are case-insensitive)
        got = [lowered.get(h.lower()) for h in HEADERS]
        if any(v is None for v in got):
            raise SiteAuthError("the request is not signed", "send it with the site client (it signs every request)")
        user, t, nonce, sig = (str(v) for v in got)
        if not (_USER.fullmatch(user) and _NONCE.fullmatch(nonce) and _SIG.fullmatch(sig)):
            raise SiteAuthError("the request's signature headers are malformed", "send it with the site client")
        try:
            sent = float(t)
        except ValueError:
            raise SiteAuthError("the request's time is not a number", "send it with the site client") from None
        token = self.secret_of(user)
        expected = _mac(token, user, t, nonce, method, path, body) if token else _mac("00", user, t, nonce, method,
                                                                                        path, body)  # fmt: skip
        if token is None or not hmac.compare_digest(expected, sig):
            raise SiteAuthError(f"the request is not signed with {user}'s token (forged, altered or a revoked token)",
                                "use the token file `supervise site token` issued to you")  # fmt: skip
        now = self.clock()
        if not abs(now - sent) <= self.window_s:
            raise SiteAuthError(f"the request was signed {now - sent:.0f} s off the service's clock (more than "
                                f"{self.window_s:.0f} s: stale, or a replay)",
                                "check the clocks of the campaign's node and the service (NTP)")  # fmt: skip
        with self._lock:
            for old in [n for n, s in self._seen.items() if abs(now - s) > self.window_s]:
                del self._seen[old]
            if nonce in self._seen:
                raise SiteAuthError("the request was already received (a replay)", "sign every request anew")
            self._seen[nonce] = sent
        return user


# -- view keys: read-only, expiring, for a browser (the fleet page) or a Prometheus scrape -------------------------
# A browser cannot sign each request, and a scraper sends one fixed header. A view key is the user's name, an
# expiry and an HMAC over both with the user's token: it lets its holder read the fleet (``GET /v1/fleet``,
# ``GET /metrics``) until it expires, and nothing else; issuing a new token revokes every key made from the old one.
def _view_mac(token: str, user: str, expires: int) -> str:
    head = "\n".join(("slurm-supervisor site view v1", user, str(expires))).encode()
    return hmac.new(bytes.fromhex(token), head, hashlib.sha256).hexdigest()


def view_key(user: str, token: str, expires: float) -> str:
    """A read-only key for ``user`` that stops working at ``expires`` (epoch seconds)."""
    at = int(expires)
    return f"{valid_user(user)}.{at}.{_view_mac(token, user, at)}"


_VIEW_KEY = re.compile(r"([A-Za-z0-9._-]{1,64})\.([0-9]{1,12})\.([0-9a-f]{64})")


def verify_view_key(key: str, secret_of: Callable[[str], str | None], now: float) -> str:
    """The user a view key was issued for, or ``SiteAuthError`` (malformed, forged, revoked or expired)."""
    found = _VIEW_KEY.fullmatch(key) if isinstance(key, str) else None
    if found is None:
        raise SiteAuthError("the view key is malformed", "use the URL or key `supervise site url` printed")
    user, expires, mac = found.group(1), int(found.group(2)), found.group(3)
    token = secret_of(user)
    if token is None or not hmac.compare_digest(_view_mac(token, user, expires), mac):
        raise SiteAuthError(f"the view key was not made with {user}'s token (forged, or the token was replaced)",
                            "print a new one with `supervise site url`")  # fmt: skip
    if now >= expires:
        raise SiteAuthError(f"the view key expired {now - expires:.0f} s ago", "print a new one with `supervise site url`")
    return user

"""Signed requests to the site service (supervisor/site/auth.py): the signer is known, a forged, altered, stale or
replayed request is refused with one line, and no header an attacker writes raises anything but SiteAuthError."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.site.auth import HEADERS, SiteAuthError, Verifier, new_token, sign

ALICE, BOB = new_token(), new_token()
NOW = 1_800_000_000.0


def verifier(clock: float = NOW) -> Verifier:
    return Verifier({"alice": ALICE, "bob": BOB}.get, clock=lambda: clock)


def test_a_signed_request_names_its_signer() -> None:
    headers = sign("alice", ALICE, "POST", "/v1/verdicts", b'{"node": "n1"}', now=NOW)
    assert verifier().verify(headers, "POST", "/v1/verdicts", b'{"node": "n1"}') == "alice"


def test_header_names_are_case_insensitive() -> None:
    headers = {k.lower(): v for k, v in sign("alice", ALICE, "GET", "/v1/excluded", b"", now=NOW).items()}
    assert verifier().verify(headers, "GET", "/v1/excluded", b"") == "alice"


@pytest.mark.parametrize("change", ["body", "path", "method", "user", "token"])
def test_forged_or_altered_requests_are_refused(change: str) -> None:
    user, token = ("bob", ALICE) if change == "token" else ("alice", ALICE)  # bob signing with alice's token
    headers = sign(user, token, "POST", "/v1/verdicts", b'{"node": "n1"}', now=NOW)
    if change == "user":
        headers["X-Site-User"] = "bob"  # alice's request passed off as bob's
    body = b'{"node": "n2"}' if change == "body" else b'{"node": "n1"}'
    path = "/v1/forgive" if change == "path" else "/v1/verdicts"
    method = "GET" if change == "method" else "POST"
    with pytest.raises(SiteAuthError, match="not signed with"):
        verifier().verify(headers, method, path, body)


def test_a_replayed_request_is_refused_and_a_stale_one_too() -> None:
    v = verifier()
    headers = sign("alice", ALICE, "POST", "/v1/verdicts", b"{}", now=NOW)
    assert v.verify(headers, "POST", "/v1/verdicts", b"{}") == "alice"
    with pytest.raises(SiteAuthError, match="replay"):
        v.verify(headers, "POST", "/v1/verdicts", b"{}")
    old = sign("alice", ALICE, "POST", "/v1/verdicts", b"{}", now=NOW - 600)
    with pytest.raises(SiteAuthError, match="600 s off the service's clock") as info:
        v.verify(old, "POST", "/v1/verdicts", b"{}")
    assert "NTP" in info.value.one_line()


def test_an_unknown_user_or_unsigned_request_is_refused() -> None:
    with pytest.raises(SiteAuthError, match="not signed"):
        verifier().verify({}, "GET", "/v1/nodes", b"")
    with pytest.raises(SiteAuthError, match="not signed with mallory"):
        verifier().verify(sign("mallory", new_token(), "GET", "/v1/nodes", b"", now=NOW), "GET", "/v1/nodes", b"")


@given(st.dictionaries(st.sampled_from([*HEADERS, "x-site-user", "Other"]), st.text(max_size=80), max_size=6),
       st.binary(max_size=64))
def test_any_headers_an_attacker_writes_raise_only_the_typed_error(headers: dict[str, str], body: bytes) -> None:
    try:
        verifier().verify(headers, "POST", "/v1/verdicts", body)
    except SiteAuthError as err:
        assert err.one_line()
    else:
        pytest.fail("an unsigned request was accepted")

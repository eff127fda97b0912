"""Prometheus metrics of a running campaign (optional extra ``metrics``: prometheus-client)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: off unless ``listen`` is set, e.g. ``listen = "127.0.0.1:9464"``."""

    listen: str = ""  # host:port to serve /metrics on; "" = off. Bind to loopback or a private address.

    def __post_init__(self) -> None:
        if not isinstance(self.listen, str):
            raise ValueError(f"metrics.listen must be a string like \"127.0.0.1:9464\", got {self.listen!r}")
        if self.listen:
            parse_listen(self.listen)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> MetricsConfig:
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ValueError(f"metrics.{key}: unknown setting; known settings: {', '.join(sorted(known))}")
        return cls(**dict(data))


def parse_listen(text: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` / ``"[::1]:9464"`` -> (host, port); ValueError naming the fix otherwise."""
    host, sep, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    fix = 'use "ADDRESS:PORT", e.g. "127.0.0.1:9464"'
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"metrics.listen = {text!r} is not ADDRESS:PORT ({fix})")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"metrics.listen = {text!r}: port {port} is out of range 1-65535 ({fix})")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"metrics.listen = {text!r}: {host!r} is not an IP address ({fix})") from None
    return host, port

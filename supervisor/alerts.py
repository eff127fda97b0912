"""L2+ alerts: a JSON document POSTed to a webhook and/or given on stdin to a command.

An alert says what was measured, against which threshold, for how long, on which job, and what to do; the
hook never blocks the supervisor for long (short timeouts) and a failing hook is logged, never fatal.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Mapping
from typing import Any

import structlog

from supervisor.config import AlertConfig

log = structlog.get_logger("supervisor.alerts")


def document(job_id: str, campaign: str, action: Mapping[str, Any], detections: list[Mapping[str, Any]]) -> dict[str, Any]:
    first = detections[0] if detections else {}
    return {
        "job_id": job_id,
        "campaign": campaign,
        "tier": action.get("tier"),
        "class": action.get("params", {}).get("class") or action.get("params", {}).get("warning"),
        "nodes": list(action.get("target", [])),
        "metric": first.get("metric"),
        "value": first.get("value"),
        "threshold": first.get("threshold"),
        "duration_s": first.get("duration_s"),
        "message": action.get("reason", ""),
        "suggested_action": action.get("params", {}).get("suggested_action", ""),
    }


def send(config: AlertConfig, doc: Mapping[str, Any], timeout_s: float = 5.0) -> list[str]:
    """Deliver an alert to every configured hook; returns the problems (empty when all went through)."""
    problems: list[str] = []
    body = json.dumps(doc, sort_keys=True, default=str).encode()
    if config.command:
        try:
            subprocess.run(list(config.command), input=body, timeout=timeout_s, check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        except (OSError, subprocess.SubprocessError) as err:
            problems.append(f"alert command {config.command[0]} failed: {err}")
    if config.webhook_url:
        if not config.webhook_url.startswith(("http://", "https://")):
            problems.append(f"alert webhook {config.webhook_url!r} is not an http(s) URL")
        else:
            request = urllib.request.Request(config.webhook_url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=timeout_s):  # noqa: S310 - scheme checked above
                    pass
            except OSError as err:
                problems.append(f"alert webhook failed: {err}")
    for problem in problems:
        log.warning("alert_failed", problem=problem)
    return problems

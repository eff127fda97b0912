"""Prometheus metrics of a running campaign (optional extra ``metrics``: prometheus-client), off by default.

``[metrics] listen = "127.0.0.1:9464"`` turns the endpoint on. The supervision loop feeds it through one call,
:meth:`Metrics.update` (the live document it writes to live.json anyway, and the campaign state it keeps: the
journal's one fold); a scrape reads only the figures copied here, never the live table, the loop's state or the
journal file. Series: per-rank step rate and
beat age (the worst ``max_rank_series`` ranks, as live.json shows them), iteration time percentiles across ranks,
interruptions by class, restarts, excluded nodes, goodput so far, checkpoint age.
"""

from __future__ import annotations

import ipaddress
import math
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from supervisor.decisions.campaign_state import CampaignState


@dataclass(frozen=True)
class MetricsConfig:
    """``[metrics]``: off unless ``listen`` is set, e.g. ``listen = "127.0.0.1:9464"``. The endpoint has no
    authentication: a non-loopback address is refused unless ``allow_remote = true`` (then said as a warning)."""

    listen: str = ""  # host:port to serve /metrics on; "" = off
    allow_remote: bool = False  # serve other hosts too (put it behind a firewall: anyone who reaches it reads it)

    def __post_init__(self) -> None:
        if not isinstance(self.listen, str):
            raise ValueError(f"metrics.listen must be a string like \"127.0.0.1:9464\", got {self.listen!r}")
        if not isinstance(self.allow_remote, bool):
            raise ValueError(f"metrics.allow_remote must be true or false, got {self.allow_remote!r}")
        if self.listen and not is_loopback(parse_listen(self.listen)[0]) and not self.allow_remote:
            raise ValueError(f"metrics.listen = {self.listen!r} is not a loopback address and the endpoint has no "
                             "authentication: use 127.0.0.1 (scrape through an SSH tunnel or a local agent), or set "
                             "metrics.allow_remote = true to serve other hosts")  # fmt: skip

    @property
    def remote(self) -> bool:
        """Serving other hosts (the warning's condition)."""
        return bool(self.listen) and not is_loopback(parse_listen(self.listen)[0])

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> MetricsConfig:
        known = {f.name for f in fields(cls)}
        for key in data:
            if key not in known:
                raise ValueError(f"metrics.{key}: unknown setting; known settings: {', '.join(sorted(known))}")
        return cls(**dict(data))


def parse_listen(text: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"`` / ``"[::1]:9464"`` -> (host, port); ValueError naming the fix otherwise. Port 0
    picks a free port (the bound address is logged and in ``Metrics.address``)."""
    host, sep, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    fix = 'use "ADDRESS:PORT", e.g. "127.0.0.1:9464"'
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"metrics.listen = {text!r} is not ADDRESS:PORT ({fix})")
    port = int(port_text)
    if not 0 <= port < 65536:
        raise ValueError(f"metrics.listen = {text!r}: port {port} is out of range 0-65535 ({fix})")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"metrics.listen = {text!r}: {host!r} is not an IP address ({fix})") from None
    return host, port


def is_loopback(host: str) -> bool:
    return ipaddress.ip_address(host).is_loopback


REMOTE_WARNING = ("the metrics endpoint serves other hosts without authentication (metrics.allow_remote): anyone "
                  "who reaches {listen} reads the campaign's figures; keep it behind a firewall")  # fmt: skip


# ------------------------------------------------------------------------------------------------ state (pure)

QUANTILES = (0.5, 0.9, 0.99)
GOODPUT_S = 10.0  # goodput (a pass over the campaign's timed events) is recomputed at most this often
RENDER_S = 1.0  # the page is rendered at most this often (a scrape copies the last one)


def quantile(values: Sequence[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Figures:
    """What the endpoint shows, taken from the campaign state (``campaign_state.CampaignState``, the journal's one
    fold) and the latest live snapshot at each update: a scrape reads only this copy, never the loop's state."""

    interruptions: dict[str, int] = field(default_factory=dict)
    launches: int = 0
    excluded: set[str] = field(default_factory=set)
    checkpoint_t: float | None = None
    checkpoint_step: int | None = None
    goodput: Mapping[str, Any] | None = None
    ranks: list[Mapping[str, Any]] = field(default_factory=list)
    iteration_s: list[float] = field(default_factory=list)

    def take_state(self, state: CampaignState, goodput: Mapping[str, Any] | None) -> None:
        self.interruptions = dict(state.interruptions)
        self.launches = len(state.accounting.launches)
        self.excluded = set(state.excluded_now)
        self.checkpoint_t = state.last_commit_t
        latest = state.accounting.latest_ckpt or {}
        self.checkpoint_step = latest.get("step") if isinstance(latest.get("step"), int) else None
        self.goodput = goodput

    def take_live(self, live: Any, max_ranks: int) -> None:
        """``live``: the live.json document, or the aggregator's ``Snapshot`` (``server.latest``), whose rows are
        chosen here (the worst ``max_ranks``, as live.json does) only when scraped."""
        if live is not None and not isinstance(live, Mapping) and hasattr(live, "ranks"):
            from supervisor.heartbeat.live import worst_ranks

            rows: list[Any] = [r._asdict() for r in worst_ranks(list(live.ranks), max_ranks)]
        else:
            rows = list((live or {}).get("ranks") or [])[:max_ranks]
        self.ranks = [r for r in rows if isinstance(r, Mapping)]
        self.iteration_s = [v for v in (_float(r.get("ewma_s")) for r in self.ranks) if v is not None and v > 0]


def _float(value: Any) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


# ------------------------------------------------------------------------------------------------ endpoint


class Metrics:
    """The Prometheus collector and (optionally) its HTTP endpoint. The loop calls :meth:`update` with the
    live document (``heartbeat.live.live_document``) and the journal events so far; scrapes read the last state
    under a lock, so a scrape never touches the live table or the journal."""

    def __init__(self, campaign: str = "", job_id: str = "", max_rank_series: int = 1024,
                 clock: Callable[[], float] = time.time) -> None:  # fmt: skip
        from prometheus_client import CollectorRegistry

        self.campaign, self.job_id, self.max_rank_series, self.clock = campaign, job_id, max_rank_series, clock
        self.figures = Figures()
        self.goodput_at = self.rendered_at = float("-inf")
        self._live: Any = None
        self._lock = threading.Lock()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)  # type: ignore[arg-type]
        self._server: Any = None
        self._thread: Any = None
        self.address: tuple[str, int] | None = None

    def update(self, live: Any, state: CampaignState) -> None:
        """The one call the supervision loop makes, each pass: ``live`` is the aggregator's latest ``Snapshot``
        (``server.latest``) or a live.json document, ``state`` the campaign state the loop keeps. Its figures are
        copied here; goodput (a pass over the campaign's timed events) at most every ``GOODPUT_S``; the page is
        rendered at most every ``RENDER_S`` and handed to the server, which serves it as it is. Never raises."""
        try:
            now = self.clock()
            goodput = self.figures.goodput
            if now - self.goodput_at >= GOODPUT_S:
                self.goodput_at, goodput = now, state.report(now)["goodput"]
            with self._lock:
                self.figures.take_state(state, goodput)
                self._live = live
                job = live.get("job") if isinstance(live, Mapping) else getattr(live, "job", None)
                if job:
                    self.job_id = str(job)
            if now - self.rendered_at >= RENDER_S:
                self.rendered_at = now
                self.render()
        except Exception:  # noqa: BLE001 - metrics must never disturb supervision
            pass

    def render(self) -> bytes:
        """The page in Prometheus' text format, handed to the server (scrapes never render)."""
        from prometheus_client import generate_latest

        page = generate_latest(self.registry)  # type: ignore[arg-type]
        if self._server is not None:
            self._server.publish(page)
        return page

    def serve(self, listen: str, **limits: Any) -> tuple[str, int]:
        """Start the endpoint on ``listen`` (``"127.0.0.1:9464"``; port 0 picks one); returns the bound address.
        ``limits``: the server's request rate and connection caps (``metrics_server.PageServer``)."""
        from supervisor.metrics_server import serve

        host, port = parse_listen(listen)
        self._server, self._thread = serve(host, port, **limits)
        self.address = (host, int(self._server.server_address[1]))
        self.render()
        return self.address

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            s = self.figures
            try:
                s.take_live(self._live, self.max_rank_series)
            except Exception:  # noqa: BLE001 - a malformed document shows no rank series, never an error
                s.ranks, s.iteration_s = [], []
            ranks, iters = list(s.ranks), list(s.iteration_s)
            interruptions, excluded = dict(s.interruptions), sorted(s.excluded)
            launches, ckpt_t, ckpt_step, goodput = s.launches, s.checkpoint_t, s.checkpoint_step, s.goodput
        now = self.clock()
        base = {"campaign": self.campaign, "job": self.job_id}
        labels = list(base)

        rate = GaugeMetricFamily("supervise_rank_step_rate", "Steps per second of a rank (last interval, else EWMA)",
                                 labels=[*labels, "rank", "node"])  # fmt: skip
        age = GaugeMetricFamily("supervise_rank_beat_age_seconds", "Seconds since a rank's last heartbeat",
                                labels=[*labels, "rank", "node"])  # fmt: skip
        for r in ranks:
            key = [*base.values(), str(r.get("rank")), str(r.get("node"))]
            value = _float(r.get("steps_per_s"))
            value = value if value is not None else _float(r.get("ewma_steps_per_s"))
            if value is not None:
                rate.add_metric(key, value)
            beat = _float(r.get("beat_age_s"))
            if beat is not None:
                age.add_metric(key, beat)
        yield rate
        yield age

        it = GaugeMetricFamily("supervise_iteration_seconds", "Iteration time across ranks (each rank's EWMA)",
                               labels=[*labels, "quantile"])  # fmt: skip
        if iters:
            for q in QUANTILES:
                it.add_metric([*base.values(), str(q)], quantile(iters, q))
        yield it

        intr = CounterMetricFamily("supervise_interruptions", "Interruptions of the training, by class",
                                   labels=[*labels, "class"])  # fmt: skip
        for cls, n in sorted(interruptions.items()):
            intr.add_metric([*base.values(), cls], n)
        yield intr
        restarts = CounterMetricFamily("supervise_restarts", "Training step relaunches (in place or after a requeue)",
                                       labels=labels)  # fmt: skip
        restarts.add_metric(list(base.values()), max(0, launches - 1))
        yield restarts

        exc = GaugeMetricFamily("supervise_excluded_nodes", "Nodes excluded from the campaign", labels=labels)
        exc.add_metric(list(base.values()), len(excluded))
        yield exc
        exc_node = GaugeMetricFamily("supervise_excluded_node", "1 for each excluded node", labels=[*labels, "node"])
        for node in excluded:
            exc_node.add_metric([*base.values(), node], 1)
        yield exc_node

        ckpt = GaugeMetricFamily("supervise_checkpoint_age_seconds", "Seconds since the newest committed checkpoint",
                                 labels=labels)  # fmt: skip
        if ckpt_t is not None:
            ckpt.add_metric(list(base.values()), max(0.0, now - ckpt_t))
        yield ckpt
        step = GaugeMetricFamily("supervise_checkpoint_step", "Step of the newest committed checkpoint", labels=labels)
        if ckpt_step is not None:
            step.add_metric(list(base.values()), ckpt_step)
        yield step

        yield from self._goodput(goodput, base)

    def _goodput(self, g: Mapping[str, Any] | None, base: dict[str, str]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        ettr = GaugeMetricFamily("supervise_goodput_ratio", "Productive time / wall time so far (ETTR)",
                                 labels=list(base))  # fmt: skip
        seconds = GaugeMetricFamily("supervise_goodput_seconds", "Wall time so far, split into productive and badput",
                                    labels=[*base, "kind"])  # fmt: skip
        if g is not None:
            if g.get("ettr") is not None:
                ettr.add_metric(list(base.values()), g["ettr"])
            seconds.add_metric([*base.values(), "wall"], g["wall_s"])
            seconds.add_metric([*base.values(), "productive"], g["productive_s"])
            for kind, value in g["badput_s"].items():
                seconds.add_metric([*base.values(), f"badput_{kind}"], value)
        yield ettr
        yield seconds


def start(config: MetricsConfig, campaign: str = "", job_id: str = "") -> Metrics | None:
    """The loop's entry: None when ``[metrics] listen`` is unset (off by default) or prometheus-client is missing
    (logged); else a serving :class:`Metrics`."""
    if not config.listen:
        return None
    try:
        metrics = Metrics(campaign, job_id)
    except ImportError:
        import structlog

        structlog.get_logger("supervisor.metrics").warning(
            "metrics_unavailable", fix="pip install 'slurm-supervisor[metrics]' (prometheus-client)")
        return None
    host, port = metrics.serve(config.listen)
    import structlog

    log = structlog.get_logger("supervisor.metrics")
    log.info("metrics_serving", url=f"http://{host}:{port}/metrics")
    if config.remote:
        log.warning("metrics_remote", warning=REMOTE_WARNING.format(listen=config.listen))
    return metrics

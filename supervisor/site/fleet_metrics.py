"""The site service's fleet metrics for Prometheus (optional extra ``metrics``: prometheus-client), rendered from the
same fleet document as the fleet page (``site/fleet.py``), so a Grafana panel and the page show the same figures.
The Grafana dashboard in docs/grafana/site-fleet.json is built on exactly these names (tests/unit/test_site_fleet.py
checks that every panel's metric is exported).

Why a collector over a document and not live gauges: the service keeps nothing in memory; each scrape reads the
store once under the API's lock, like a page view.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

NAMES = {
    "supervise_site_campaigns": "Campaigns the site knows of, by their last reported state",
    "supervise_site_campaign_ettr": "A campaign's effective training time ratio (productive / wall), as last reported",
    "supervise_site_campaign_productive_seconds": "A campaign's productive seconds, as last reported",
    "supervise_site_campaign_wall_seconds": "A campaign's wall seconds under supervision, as last reported",
    "supervise_site_campaign_report_age_seconds": "Seconds since a campaign last reported",
    "supervise_site_interruptions": "Interruptions campaigns reported, by class, since the site database began",
    "supervise_site_node_failures": "Failures blamed on a node in the lemon window",
    "supervise_site_node_lemon": "1 when the lemon rule holds the node as bad for everyone",
    "supervise_site_node_lemon_p_value": "The node's Poisson p-value against the fleet's failure rate (judged nodes)",
    "supervise_site_node_repair_state": "1 for the node's repair state (drained, rebooting, returned, in service)",
}


class FleetCollector:
    """A prometheus-client collector over one fleet document and the all-time interruption counts."""

    def __init__(self, fleet: Mapping[str, Any], interruption_counts: Mapping[str, int]) -> None:
        self.fleet, self.counts = fleet, interruption_counts

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        def gauge(name: str, labels: list[str]) -> Any:
            return GaugeMetricFamily(name, NAMES[name], labels=labels)

        now = float(self.fleet["now"])
        states: dict[str, int] = {}
        ettr, productive = gauge("supervise_site_campaign_ettr", ["user", "campaign"]), \
            gauge("supervise_site_campaign_productive_seconds", ["user", "campaign"])
        wall, age = gauge("supervise_site_campaign_wall_seconds", ["user", "campaign"]), \
            gauge("supervise_site_campaign_report_age_seconds", ["user", "campaign"])
        for c in self.fleet["campaigns"]:
            key = [c["user"], c["campaign"]]
            states[c["state"]] = states.get(c["state"], 0) + 1
            if c["ettr"] is not None:
                ettr.add_metric(key, float(c["ettr"]))
            productive.add_metric(key, float(c["productive_s"]))
            wall.add_metric(key, float(c["wall_s"]))
            age.add_metric(key, max(0.0, now - float(c["t"])))
        campaigns = gauge("supervise_site_campaigns", ["state"])
        for state, n in sorted(states.items()):
            campaigns.add_metric([state], n)
        yield from (campaigns, ettr, productive, wall, age)

        counter = CounterMetricFamily("supervise_site_interruptions", NAMES["supervise_site_interruptions"],
                                      labels=["class"])  # fmt: skip
        for klass, n in sorted(self.counts.items()):
            counter.add_metric([klass], n)
        yield counter

        failures, lemon = gauge("supervise_site_node_failures", ["node"]), gauge("supervise_site_node_lemon", ["node"])
        p_value = gauge("supervise_site_node_lemon_p_value", ["node"])
        repair = gauge("supervise_site_node_repair_state", ["node", "state"])
        for n in self.fleet["nodes"]:
            failures.add_metric([n["node"]], n["failures"])
            lemon.add_metric([n["node"]], 1 if n["lemon"] else 0)
            if n["p_value"] is not None:
                p_value.add_metric([n["node"]], n["p_value"])
            repair.add_metric([n["node"], n["repair"]["state"]], 1)
        yield from (failures, lemon, p_value, repair)


def render(fleet: Mapping[str, Any], interruption_counts: Mapping[str, int]) -> bytes:
    """The text exposition format; ``ImportError`` when prometheus-client is not installed."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(FleetCollector(fleet, interruption_counts))  # type: ignore[arg-type]
    return bytes(generate_latest(registry))

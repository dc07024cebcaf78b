"""The TCP listeners' connection counters (tesla_gateway/connection_limits.py) as metric families.

One family per counter, labelled by listener (``metrics``, or a fleet source's name), so a
flood of idle or refused connections shows on the dashboard before it shows in the journal.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from tesla_gateway.metrics.collector import PREFIX

__all__ = ["ListenerCollector", "ListenerStats"]

ListenerStats = Mapping[str, Mapping[str, int]]  # listener name -> ConnectionLimiter.stats()


class ListenerCollector(Collector):
    """Reads every listener's counters at each scrape."""

    def __init__(self, listeners: Callable[[], ListenerStats]) -> None:
        self._listeners = listeners

    def collect(self) -> Iterator[Metric]:
        name = f"{PREFIX}_listener_connections"
        open_now = GaugeMetricFamily(
            f"{name}_open", "Connections open now, per listener.", labels=["listener"]
        )
        accepted = CounterMetricFamily(
            f"{name}_accepted", "Connections accepted, per listener.", labels=["listener"]
        )
        refused = CounterMetricFamily(
            f"{name}_refused",
            "Connections closed on accept, per listener and the bound they hit (total, per_host).",
            labels=["listener", "bound"],
        )
        idle = CounterMetricFamily(
            f"{name}_idle_closed",
            "Connections cut after idle_timeout_s without a byte either way, per listener.",
            labels=["listener"],
        )
        for listener, stats in sorted(self._listeners().items()):
            open_now.add_metric([listener], stats.get("open", 0))
            accepted.add_metric([listener], stats.get("accepted", 0))
            refused.add_metric([listener, "total"], stats.get("refused_total", 0))
            refused.add_metric([listener, "per_host"], stats.get("refused_per_host", 0))
            idle.add_metric([listener], stats.get("idle_closed", 0))
        yield from (open_now, accepted, refused, idle)

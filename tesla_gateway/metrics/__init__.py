"""Prometheus metrics: the daemon's stats snapshot on an optional ``/metrics`` HTTP endpoint.

``config`` (the ``[metrics]`` section), ``collector`` (snapshot -> metric families, Prometheus
naming), ``server`` (an aiohttp app around prometheus_client's own handler, owned by the
service's TaskGroup), ``listeners`` (connection counters), and what the daemon records for
them: ``latency`` (the hand-off latency histogram's counts) and ``sensor_values`` (the newest
value per sensor and feature). Needs the ``metrics`` extra (``prometheus_client``); only
``config``, ``latency`` and ``sensor_values`` import without it.
"""

from tesla_gateway.metrics.config import MetricsConfig

__all__ = ["MetricsConfig"]

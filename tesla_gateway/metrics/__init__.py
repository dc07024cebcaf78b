"""Prometheus metrics: the daemon's stats snapshot on an optional ``/metrics`` HTTP endpoint.

``config`` (the ``[metrics]`` section), ``collector`` (snapshot -> metric families, Prometheus
naming), ``server`` (an aiohttp app around prometheus_client's own handler, owned by the
service's TaskGroup). Needs the ``metrics`` extra (``prometheus_client``); only ``config``
imports without it.
"""

from tesla_gateway.metrics.config import MetricsConfig

__all__ = ["MetricsConfig"]

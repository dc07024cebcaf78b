"""Prometheus families of co-located sensors' interval coverage (monitor/coverage.py).

Read from the monitor's stats (``drift`` entries, one per sensor beside a reference): the
rolling coverage and mean width of the published intervals, and of the intervals adaptive
conformal inference widened or narrowed for that sensor, with the level it adapted to.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = ["interval_families"]


def interval_families(drift: Mapping[str, object], prefix: str) -> Iterator[Metric]:
    """Coverage, mean width and adapted level per (sensor, feature), by interval kind."""
    coverage = GaugeMetricFamily(
        f"{prefix}_interval_coverage_ratio",
        "Share of recent reference pairs inside the interval: 'published' (the model's) or "
        "'adapted' (adaptive conformal inference on this sensor's pairs).",
        labels=["sensor", "feature", "interval"],
    )
    width = GaugeMetricFamily(
        f"{prefix}_interval_mean_width_micrograms_per_cubic_meter",
        "Mean width (high - low) of the recent pairs' intervals, by interval kind.",
        labels=["sensor", "feature", "interval"],
    )
    level = GaugeMetricFamily(
        f"{prefix}_interval_adapted_level",
        "The level adaptive conformal inference draws this sensor's interval at (nominal: "
        "the manifest's, e.g. 0.9).",
        labels=["sensor", "feature"],
    )
    for key, document in sorted(drift.items()):
        figures = document.get("intervals") if isinstance(document, Mapping) else None
        if not isinstance(figures, Mapping):
            continue
        sensor, _, feature = key.rpartition("/")
        for kind, prefix_key in (("published", ""), ("adapted", "adapted_")):
            _add(coverage, [sensor, feature, kind], figures.get(f"{prefix_key}coverage"))
            _add(width, [sensor, feature, kind], figures.get(f"{prefix_key}mean_width"))
        _add(level, [sensor, feature], figures.get("adapted_level"))
    yield coverage
    yield width
    yield level


def _add(family: GaugeMetricFamily, labels: list[str], value: object) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        family.add_metric(labels, float(value))

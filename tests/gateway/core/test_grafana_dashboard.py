"""deploy/grafana-dashboard.json against what the daemon exports: every metric a panel queries is
one the daemon's ``/metrics`` declares (its collector, built by a real service with every series
turned on, plus the process and listener collectors), and every panel has one unit for all it
plots (a y axis in bytes is not also in CPU cores), the unit its ``fieldConfig`` sets once.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tesla_gateway.daemon.config import load_config
from tesla_gateway.daemon.service import GatewayService
from tesla_gateway.metrics.server import MetricsServer
from tesla_gateway.publish.publisher import Publisher

REPO = Path(__file__).resolve().parents[3]
DASHBOARD = REPO / "deploy" / "grafana-dashboard.json"
MODEL = REPO / "models" / "pm10-ispra-1min"
_METRIC = re.compile(r"\b(?:tesla_gateway|process)_[a-z0-9_]+\b")

# What each Grafana unit may plot (the dimension a query's result has, see query_unit).
GRAFANA_UNITS = {
    "count": {"short", "none", "bool"},
    "per_second": {"ops"},
    "seconds": {"s"},
    "bytes": {"bytes"},
    "seconds_per_second": {"percentunit"},  # CPU: 1 = one core busy
    "micrograms_per_cubic_meter": {"con\u03bcgm3"},
}


def panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))  # a collapsed row holds its panels
    return found


def queries() -> Iterator[tuple[str, str]]:
    """(panel title, PromQL) for every target and template variable."""
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in panels():
        for target in panel.get("targets", []):
            yield panel["title"], target["expr"]
    for variable in dashboard["templating"]["list"]:
        if "definition" in variable:
            yield f"${variable['name']}", variable["definition"]


def metric_unit(name: str) -> str:
    """A series' dimension from its name (Prometheus' unit suffixes)."""
    base = re.sub(r"_(total|bucket|count|sum)$", "", name)
    for suffix in ("timestamp_seconds", "seconds", "bytes", "micrograms_per_cubic_meter"):
        if base.endswith(f"_{suffix}"):
            return "timestamp" if suffix == "timestamp_seconds" else suffix
    return "count"


def query_unit(expr: str) -> str:
    """The dimension of a PromQL result, for the shapes the dashboard uses; ``?`` otherwise."""
    expr = re.sub(r"\{[^{}]*\}|\[[^\]]*\]", "", expr).strip()  # label matchers, ranges
    expr = re.sub(r"^(on|ignoring) \([^)]*\) ", "", expr)  # a vector matching modifier
    if " or " in expr:  # "a or 0 * b": both sides must agree
        return _same(query_unit(part) for part in expr.split(" or "))
    if " / " in expr:
        return _ratio(*(query_unit(part) for part in expr.split(" / ", 1)))
    expr = re.sub(r"^\d+(\.\d+)? \* ", "", expr)  # a scalar factor keeps the unit
    if re.match(r"count(\s+by\s*\([^)]*\))?\s*\(", expr):
        return "count"
    return _applied(expr, _same(metric_unit(name) for name in _METRIC.findall(expr)))


def _same(units: Iterator[str]) -> str:
    found = set(units)
    return found.pop() if len(found) == 1 else "mixed" if found else "?"


def _ratio(top: str, bottom: str) -> str:
    """A rate over a rate: seconds per second over ticks per second is seconds per tick."""
    if bottom != "per_second" or not top.endswith("per_second"):
        return "?"
    return "count" if top == "per_second" else top.removesuffix("_per_second")


def _applied(expr: str, unit: str) -> str:
    """The unit after the function the query applies to its series."""
    if unit in {"mixed", "?"} or "histogram_quantile(" in expr:
        return unit  # a quantile of a histogram is in the histogram's unit
    if "time() - " in expr:
        return "seconds" if unit == "timestamp" else "?"
    if re.search(r"\b(i?rate|deriv)\(", expr):
        return "per_second" if unit == "count" else f"{unit}_per_second"
    return unit


def exported_names(tmp_path: Path) -> set[str]:
    """Every series name ``/metrics`` declares, from the collector a real service builds."""
    state = tmp_path / "state"
    config_file = tmp_path / "gateway.toml"
    config_file.write_text(
        f'gateway_id = "gw-1"\nstate_dir = "{state}"\n'
        f'[[models]]\nfeature = "pm10"\nmodel_dir = "{MODEL}"\n'
        "[metrics]\nsensor_gauges = true\n",
        encoding="utf-8",
    )
    config = load_config(config_file)
    assert config.metrics is not None and config.metrics.sensor_staleness
    service = GatewayService(config)
    publisher = Publisher(config.publisher, gateway_id="gw-1", state_dir=state)
    try:
        server = MetricsServer(config.metrics, service.metrics_collector(publisher))
        names: set[str] = set()
        for family in server.registry.collect():
            names |= {sample.name for sample in family.samples}
            suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
            names |= {family.name + suffix for suffix in suffixes.get(family.type, [""])}
        return names
    finally:
        asyncio.run(publisher.aclose())


def test_the_dashboard_queries_only_metrics_the_daemon_exports(tmp_path: Path) -> None:
    names = exported_names(tmp_path)
    assert {
        "tesla_gateway_handoff_latency_seconds_bucket",
        "tesla_gateway_sensor_last_reading_timestamp_seconds",
        "tesla_gateway_sensor_calibrated_micrograms_per_cubic_meter",
        "process_resident_memory_bytes",
    } <= names
    unknown = sorted(
        {(title, name) for title, expr in queries() for name in _METRIC.findall(expr)}
        - {(title, name) for title, _ in queries() for name in names}
    )
    assert not unknown, f"panels query metrics the daemon does not export: {unknown}"


@pytest.mark.parametrize(
    "panel", [p for p in panels() if p["type"] != "row"], ids=lambda p: p["title"]
)
def test_each_panel_plots_one_unit_set_once(panel: dict[str, Any]) -> None:
    unit = panel["fieldConfig"]["defaults"].get("unit")
    assert unit, f"{panel['title']}: no unit in fieldConfig.defaults"
    for override in panel["fieldConfig"].get("overrides", []):
        properties = {p["id"] for p in override.get("properties", [])}
        assert "unit" not in properties, f"{panel['title']}: a second unit in an override"
    found = {target["expr"]: query_unit(target["expr"]) for target in panel["targets"]}
    assert len(set(found.values())) == 1, f"{panel['title']} mixes units: {found}"
    (dimension,) = set(found.values())
    assert unit in GRAFANA_UNITS.get(dimension, set()), (
        f"{panel['title']}: unit {unit!r} for {dimension} ({found})"
    )


def test_the_dashboard_has_an_air_quality_row() -> None:
    titles = [p["title"] for p in panels()]
    row = titles.index("Air quality")
    below = panels()[row + 1 :]
    plotted = {
        name for p in below for t in p.get("targets", []) for name in _METRIC.findall(t["expr"])
    }
    assert {
        "tesla_gateway_sensor_calibrated_micrograms_per_cubic_meter",
        "tesla_gateway_sensor_raw_micrograms_per_cubic_meter",
        "tesla_gateway_sensor_last_reading_timestamp_seconds",
    } <= plotted


@pytest.mark.parametrize(
    ("expr", "dimension"),
    [
        ('process_resident_memory_bytes{instance=~"$instance"}', "bytes"),
        ("rate(process_cpu_seconds_total[5m])", "seconds_per_second"),
        ("rate(tesla_gateway_readings_total[5m])", "per_second"),
        ("increase(tesla_gateway_outbox_dropped_total[$__range])", "count"),
        (
            "rate(tesla_gateway_inference_seconds_total[1m]) / rate(tesla_gateway_ticks_total[1m])",
            "seconds",
        ),
        ("time() - tesla_gateway_sensor_last_reading_timestamp_seconds", "seconds"),
        ("count(time() - tesla_gateway_sensor_last_reading_timestamp_seconds > 600)", "count"),
        (
            "histogram_quantile(0.9, rate(tesla_gateway_handoff_latency_seconds_bucket[1m]))",
            "seconds",
        ),
        ("count by (i) (tesla_gateway_sensors > 1) or on (i) 0 * tesla_gateway_sensors", "count"),
        ("tesla_gateway_outbox_messages + process_resident_memory_bytes", "mixed"),
        ("tesla_gateway_outbox_messages or rate(tesla_gateway_readings_total[1m])", "mixed"),
    ],
)
def test_query_units(expr: str, dimension: str) -> None:
    """The checker itself: it tells bytes from cores from rates, and sees a mix."""
    assert query_unit(expr) == dimension

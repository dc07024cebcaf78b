"""``[metrics]``: validated with the rest of the configuration, with a clear error when the
``metrics`` extra (prometheus_client 0.24 or later) is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tesla_gateway.daemon.config import load_config
from tesla_gateway.errors import ConfigError

MINIMAL = """
gateway_id = "gw-1"
state_dir = "state"
[[models]]
feature = "pm10"
model_dir = "models/pm10"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_metrics_are_off_unless_configured(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, MINIMAL), environ={}).metrics is None


def test_listen_addresses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL + "[metrics]\n"), environ={})
    assert config.metrics is not None
    assert (config.metrics.host, config.metrics.port) == ("127.0.0.1", 9108)
    assert config.metrics.sensor_staleness  # one series per sensor: on
    assert not config.metrics.sensor_gauges  # up to two per sensor and feature: asked for
    v6 = load_config(write(tmp_path, MINIMAL + '[metrics]\nlisten = "[::1]:9200"\n'), environ={})
    assert v6.metrics is not None
    assert (v6.metrics.host, v6.metrics.port) == ("::1", 9200)


@pytest.mark.parametrize(
    ("section", "staleness", "gauges"),
    [
        ("sensor_gauges = true", True, True),
        ("sensor_staleness = false", False, False),
        ("per_sensor = false", False, False),  # the earlier name keeps its meaning
        ("per_sensor = true", True, False),
    ],
)
def test_series_per_sensor(tmp_path: Path, section: str, staleness: bool, gauges: bool) -> None:
    metrics = load_config(write(tmp_path, MINIMAL + f"[metrics]\n{section}\n"), environ={}).metrics
    assert metrics is not None
    assert (metrics.sensor_staleness, metrics.sensor_gauges) == (staleness, gauges)


def test_an_unknown_metrics_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="sensor_gauge"):
        load_config(write(tmp_path, MINIMAL + "[metrics]\nsensor_gauge = true\n"), environ={})


@pytest.mark.parametrize(
    ("listen", "message"),
    [
        ("localhost", r"metrics: .*expected 'host:port'"),
        ("0.0.0.0:70000", r"metrics: .*port must be 1-65535"),
        ("[nonsense]:9108", r"metrics: .*IPv6"),
    ],
)
def test_a_bad_listen_address_is_named(tmp_path: Path, listen: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, MINIMAL + f'[metrics]\nlisten = "{listen}"\n'), environ={})


@pytest.mark.parametrize(
    "missing",
    [
        "prometheus_client",  # not installed
        "prometheus_client.aiohttp",  # older than 0.24: no aiohttp handler
    ],
)
def test_metrics_without_the_extra_is_a_config_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    monkeypatch.delitem(sys.modules, "prometheus_client.aiohttp", raising=False)  # not cached
    monkeypatch.setitem(sys.modules, missing, None)  # the import fails
    with pytest.raises(ConfigError, match=r"metrics.*pip install 'tesla-gateway\[metrics\]'"):
        load_config(write(tmp_path, MINIMAL + "[metrics]\n"), environ={})
    load_config(write(tmp_path, MINIMAL), environ={})  # without [metrics] it is not needed

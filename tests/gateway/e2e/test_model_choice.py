"""Two committed pm10 models in one daemon: each sensor gets the model its channels allow.

The daemon serves the committed defaults ``models/pm10-ispra-1min`` (PM10 alone) and
``models/pm10-ispra-1min-rh-temp`` (PM10, relative humidity, temperature; N = 360 one-minute
periods each) against a real broker. ``node-rh`` reports humidity and temperature with every
reading, ``node-plain`` does not. The calibrated topic of each must carry the values LiteRT
(run by the test) gives for that sensor's windows under the right model, and say which model,
from the first period on (both defaults calibrate from one period: a young sensor's window has
its first reading repeated before it, and the message says how many periods it really had);
its health must name the same model; the PM-only sensor must cost no covariate window; and
after a restart both sensors are calibrated at once by the same models (windows restored per
model slot).
"""

from __future__ import annotations

import json
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from devkit.broker import Mosquitto
from tesla_gateway.contract.manifest import load_manifest
from tests.gateway.e2e.harness import (
    PREFIX,
    Calibrated,
    Daemon,
    MqttNodes,
    iso,
    litert_expected,
    wait_for,
    write_config,
)
from tests.support.published import as_published

MODELS = Path(__file__).resolve().parents[3] / "models"
PLAIN, COVARIATE = "pm10-ispra-1min", "pm10-ispra-1min-rh-temp"
P, N = 60, 360
PERIODS = N + 6
CHUNK = 100


def send(nodes: MqttNodes, sensor: str, documents: list[dict[str, object]]) -> None:
    for first in range(0, len(documents), CHUNK):
        nodes.send_raw(
            f"sensors/{sensor}/raw", json.dumps(documents[first : first + CHUNK]).encode()
        )


def documents(base: int, periods: range, series: dict[str, np.ndarray]) -> list[dict[str, object]]:
    return [
        {
            "ts": base + period * P + 3,
            **{name: float(values[period]) for name, values in series.items()},
        }
        for period in periods
    ]


def window(series: np.ndarray, period: int) -> np.ndarray:
    """The N periods ending at ``period``; a young sensor's (fewer than N since its first) with
    its first reading repeated before it, as the gateway pads it."""
    have = series[max(0, period - N + 1) : period + 1]
    padding = np.repeat(series[:1], N - len(have), axis=0)
    return np.concatenate([padding, have]).astype(np.float32)


def reflected(walk: np.ndarray, low: float, high: float) -> np.ndarray:
    """The walk mirrored at ``low`` and capped at ``high``."""
    return np.minimum(low + np.abs(walk - low), high)


def health(calibrated: Calibrated, sensor: str) -> dict[str, Any] | None:
    payloads = calibrated.collector.on(f"{PREFIX}/{sensor}/pm10/health")
    return dict(json.loads(payloads[-1])) if payloads else None


def health_naming(calibrated: Calibrated, sensor: str, model: str) -> dict[str, Any] | None:
    document = health(calibrated, sensor)
    return document if document is not None and document["model"] == model else None


def test_each_sensor_is_calibrated_by_the_model_of_its_channels(
    tmp_path: Path, mosquitto: Mosquitto, daemons: list[Daemon]
) -> None:
    plain_dir, covariate_dir = tmp_path / "pm10", tmp_path / "pm10-rh-temp"
    shutil.copytree(MODELS / PLAIN, plain_dir)
    shutil.copytree(MODELS / COVARIATE, covariate_dir)
    assert load_manifest(covariate_dir).channel_names == ("pm10", "rh", "temp_c")
    config = write_config(tmp_path, mosquitto, plain_dir)
    with config.open("a", encoding="utf-8") as out:
        out.write(f'[[models]]\nfeature = "pm10"\nmodel_dir = "{covariate_dir}"\n')
        out.write("[health]\npublish_interval_s = 0.3\n")

    total = PERIODS + 1  # one more period after the restart
    rng = np.random.default_rng(21)
    # PM walks reflected at 10 µg/m³: clipped, they sat at exactly 10 for 35 and 83 periods,
    # frozen sensors whose values the gateway withholds (tesla_gateway/contract/stuck.py).
    pm10 = reflected(60 + np.cumsum(rng.normal(0, 2.0, total)), 10, 140).round(2)
    rh = np.clip(70 + np.cumsum(rng.normal(0, 1.0, total)), 30, 99).round(1)
    temp_c = np.clip(8 + np.cumsum(rng.normal(0, 0.2, total)), -2, 20).round(1)
    plain_pm10 = reflected(40 + np.cumsum(rng.normal(0, 2.0, total)), 10, 140).round(2)
    with_rh = {"pm10": pm10, "rh": rh, "temp_c": temp_c}
    plain = {"pm10": plain_pm10}
    valid = list(range(total))  # the defaults calibrate from the first period (padded)
    expected = {
        "node-rh": dict(
            zip(
                valid,
                litert_expected(
                    covariate_dir,
                    np.stack([window(np.stack([pm10, rh, temp_c], -1), p) for p in valid]),
                ),
                strict=True,
            )
        ),
        "node-plain": dict(
            zip(
                valid,
                litert_expected(plain_dir, np.stack([window(plain_pm10, p) for p in valid])),
                strict=True,
            )
        ),
    }
    model_of = {"node-rh": COVARIATE, "node-plain": PLAIN}

    calibrated = Calibrated(mosquitto)
    nodes = MqttNodes(mosquitto)
    state = tmp_path / "state"
    base = (int(time.time()) // P - total - 5) * P  # replayed, recent past

    def check(sensor: str, periods: range) -> None:
        got = calibrated.by_period(sensor)
        for period in periods:
            payload = got[iso(base + period * P)]
            assert payload["quality"] == ["ok"], (sensor, period, payload)
            assert payload["history_periods"] == min(period + 1, N)
            assert ("warm_up" in payload) == (period < N - 1)
            assert payload["model"] == model_of[sensor], (sensor, period, payload)
            assert payload["calibrated"] == as_published(float(expected[sensor][period]))

    try:
        daemons.append(Daemon(config, state))
        send(nodes, "node-rh", documents(base, range(PERIODS), with_rh))
        send(nodes, "node-plain", documents(base, range(PERIODS), plain))
        for sensor, model in model_of.items():
            wait_for(partial(calibrated.has, sensor, PERIODS), f"{sensor}'s periods")
            arrivals = calibrated.arrivals(sensor)
            assert len(arrivals) == PERIODS  # one message per period, never one per model
            check(sensor, range(PERIODS))
            document = wait_for(
                partial(health_naming, calibrated, sensor, model),
                f"{sensor}'s health naming its model",
            )
            assert document["feature"] == "pm10"
        stats = wait_for(
            lambda: (s := calibrated.latest_stats()) and s["ticker"]["calibrated"] >= 14 and s,
            "the stats",
        )
        assert stats["models"]["pm10"]["model"] == PLAIN
        assert stats["models"]["pm10-rh-temp"] == {
            **stats["models"]["pm10-rh-temp"],
            "feature": "pm10",
            "model": COVARIATE,
            "channels": ["pm10", "rh", "temp_c"],
        }
        assert stats["windows"]["pm10"]["sensors"] == 2
        assert stats["windows"]["pm10-rh-temp"]["sensors"] == 1  # no covariate window for plain

        assert daemons[-1].stop() == 0
        saved = {p.name for p in (state / "windows").glob("*.npz")}
        assert saved == {"pm10.npz", "pm10-rh-temp.npz"}  # one snapshot per model slot
        daemons.append(Daemon(config, state))
        send(nodes, "node-rh", documents(base, range(PERIODS, total), with_rh))
        send(nodes, "node-plain", documents(base, range(PERIODS, total), plain))
        for sensor in model_of:
            wait_for(partial(calibrated.has, sensor, total), f"{sensor}'s period after restart")
            check(sensor, range(PERIODS, total))  # restored windows: no second warm-up
    finally:
        nodes.close()
        calibrated.close()

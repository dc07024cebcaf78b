"""Covariates through the real daemon: a bad one costs only itself, and parts of a reading join.

The daemon serves two pm10 models side by side (PM alone; PM with rh and temp_c, tiny models
from tests.support.models) against a real mosquitto. A node whose humidity sensor returns
garbage in some periods still has every period published (the PM-only model calibrates those),
each bad covariate counted as ``bad_covariate``. A node that publishes its PM and its rh/temp in
separate messages, stamped alike, is calibrated by the covariate model. Expected calibrations
come from LiteRT run by the test.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np

from devkit.broker import Mosquitto
from tests.gateway.e2e.harness import (
    MODEL,
    Calibrated,
    Daemon,
    MqttNodes,
    N,
    P,
    grid_base,
    iso,
    litert_expected,
    wait_for,
    write_config,
)
from tests.support.models import ModelFactory, TestModel
from tests.support.published import as_published

PLAIN, COVARIATE = "pm10-plain", "pm10-rh-temp"
CHANNELS = ("pm10", "rh", "temp_c")


def two_models(
    tmp_path: Path, mosquitto: Mosquitto, factory: ModelFactory
) -> tuple[Path, TestModel, TestModel]:
    plain = factory.copy(tmp_path / "plain", **MODEL, name=PLAIN, seed=1)
    covariate = factory.copy(
        tmp_path / "rh-temp", **MODEL, name=COVARIATE, seed=5, extra_channels=("rh", "temp_c")
    )
    config = write_config(tmp_path, mosquitto, plain.path)
    with config.open("a", encoding="utf-8") as out:
        out.write(f'[[models]]\nfeature = "pm10"\nmodel_dir = "{covariate.path}"\n')
    return config, plain, covariate


def series(periods: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "pm10": rng.uniform(10, 90, periods).round(2),
        "rh": rng.uniform(30, 90, periods).round(1),
        "temp_c": rng.uniform(-2, 25, periods).round(1),
    }


def expected(model: TestModel, values: dict[str, np.ndarray], period: int) -> float:
    window = np.stack(
        [values[name][period - N + 1 : period + 1] for name in model.manifest.channel_names], -1
    )
    shaped = window[None, :, 0] if window.shape[-1] == 1 else window[None]
    return float(litert_expected(model.path, shaped)[0])


def rejected_by_reason(calibrated: Calibrated) -> dict[str, int]:
    by_reason: dict[str, int] = calibrated.latest_stats().get("rejected", {}).get("by_reason", {})
    return by_reason


# Period -> the humidity the node sent: out of range both ways, NaN, not a number, infinite.
BAD_RH = {10: "400", 14: "-50", 18: "NaN", 22: '"wet"', 26: "1e400"}
PERIODS = 37


def test_a_bad_covariate_costs_the_covariate_and_never_the_period(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    config, plain, covariate = two_models(tmp_path, mosquitto, model_factory)
    values = series(PERIODS, 31)
    base = grid_base(PERIODS + 5)
    calibrated = Calibrated(mosquitto)
    nodes = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state"))
        for period in range(PERIODS):
            rh = BAD_RH.get(period, json.dumps(float(values["rh"][period])))
            payload = (
                f'{{"ts": {base + period * P + 1}, "pm10": {values["pm10"][period]}, '
                f'"rh": {rh}, "temp_c": {values["temp_c"][period]}}}'
            )
            nodes.send_raw("sensors/node-rh/raw", payload.encode())
        wait_for(partial(calibrated.has, "node-rh", PERIODS), "every period of node-rh")
        got = calibrated.by_period("node-rh")
        assert len(got) == PERIODS  # before: the 5 periods with a bad rh were never published
        for period in range(N, PERIODS):
            document = got[iso(base + period * P)]
            assert document["raw"] == as_published(float(values["pm10"][period]))
            if period in BAD_RH:  # the covariate window lacks rh now: the PM-only model serves
                assert document["model"] == PLAIN, period
                assert document["calibrated"] == as_published(expected(plain, values, period))
            else:
                assert document["model"] == COVARIATE, period
                assert document["calibrated"] is not None
        for period in range(N, min(BAD_RH)):  # windows with only what the node sent
            assert got[iso(base + period * P)]["calibrated"] == as_published(
                expected(covariate, values, period)
            )
        counted = wait_for(
            lambda: (r := rejected_by_reason(calibrated)).get("bad_covariate") == len(BAD_RH) and r,
            "five bad_covariate rejects on the stats topic",
        )
        assert counted == {"bad_covariate": len(BAD_RH)}  # and no reading rejected whole
    finally:
        nodes.close()
        calibrated.close()


def test_pm_and_covariates_in_separate_messages_reach_the_covariate_model(
    tmp_path: Path, mosquitto: Mosquitto, model_factory: ModelFactory, daemons: list[Daemon]
) -> None:
    config, _, covariate = two_models(tmp_path, mosquitto, model_factory)
    periods = N + 6
    values = series(periods, 32)
    base = grid_base(periods + 5)
    calibrated = Calibrated(mosquitto)
    nodes = MqttNodes(mosquitto)
    try:
        daemons.append(Daemon(config, tmp_path / "state"))
        for period in range(periods):
            stamp = base + period * P + 1  # both messages carry the same time
            pm = {"ts": stamp, "pm10": float(values["pm10"][period])}
            climate = {
                "ts": stamp,
                "humidity": float(values["rh"][period]),
                "temperature": float(values["temp_c"][period]),
            }
            nodes.send_raw("sensors/node-split/raw", json.dumps(pm).encode())
            nodes.send_raw("sensors/node-split/raw", json.dumps(climate).encode())
        wait_for(partial(calibrated.has, "node-split", periods), "every period of node-split")
        got = calibrated.by_period("node-split")
        # The covariate window opens with the second period (the node's first PM came before
        # anything said it has covariates), so it is whole from period N on.
        for period in range(N, periods):
            payload = got[iso(base + period * P)]
            assert payload["model"] == COVARIATE, (period, payload)
            assert payload["raw"] == as_published(float(values["pm10"][period]))
            assert payload["calibrated"] == as_published(expected(covariate, values, period))
        stats = calibrated.latest_stats()
        [slot] = [s for s, m in stats["models"].items() if m["channels"] == list(CHANNELS)]
        assert stats["windows"][slot]["sensors"] == 1
        assert stats["windows"][slot]["outcomes"]["duplicate"] == 0  # the parts were not
        assert rejected_by_reason(calibrated) == {}
    finally:
        nodes.close()
        calibrated.close()

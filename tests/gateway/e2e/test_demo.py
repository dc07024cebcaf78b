"""``python -m devkit.demo`` (``make demo``) end to end, shortened and on a small model.

It must start its own broker, daemon and simulated nodes, end by itself, report every sensor,
write the traces and the plot, and stop the daemon cleanly; and fail with an actionable
message when something it needs is missing.
"""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from tesla_gateway.contract.manifest import PredictionIntervals, write_manifest
from tests.support.models import ModelFactory, TestModel

DEMO_TIMEOUT_S = 120
SENSORS = ("4065D0", "4065E0", "4065ED")


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devkit.demo", "--plain", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=DEMO_TIMEOUT_S,
    )


def _calibrates_from_one_period(model: TestModel) -> None:
    """As the committed defaults do: min_history_periods 1, with intervals to draw."""
    intervals = PredictionIntervals(
        level=0.9, edges=[], half_widths=[3.0], counts=[100], calibration_sensor="v"
    )
    write_manifest(
        model.path,
        model.manifest.model_copy(update={"min_history_periods": 1, "intervals": intervals}),
    )


def test_demo_runs_the_daemon_and_ends_by_itself(
    tmp_path: Path, model_factory: ModelFactory
) -> None:
    model = model_factory.copy(tmp_path / "model", window_length=8, period_seconds=60)
    covariate = model_factory.copy(
        tmp_path / "covariate",
        window_length=8,
        period_seconds=60,
        name="test-rh-temp",
        extra_channels=("rh", "temp_c"),
    )
    for served in (model, covariate):
        _calibrates_from_one_period(served)
    out = tmp_path / "out"
    # 4 s at one replayed hour per second: 240 minutes per sensor, N = 8.
    result = run_demo(
        "--seconds", "4", "--speed", "3600", "--model", str(model.path),
        "--covariate-model", str(covariate.path), "--out", str(out)
    )  # fmt: skip
    assert result.returncode == 0, result.stderr + result.stdout
    summary = result.stdout[result.stdout.index("role in training") :]
    for sensor in SENSORS:
        assert sensor in summary
    with (out / "demo-traces.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    by_sensor = {s: [r for r in rows if r["sensor_id"] == s] for s in SENSORS}
    for sensor, sensor_rows in by_sensor.items():
        assert len(sensor_rows) > 100, sensor
        # calibrated from the first period on, with the history it had and an interval
        assert not any(r["quality"] == "warming_up" for r in sensor_rows)
        assert sensor_rows[0]["calibrated"] != "" and sensor_rows[0]["interval_high"] != ""
        assert [int(r["history_periods"]) for r in sensor_rows[:9]] == [1, 2, 3, 4, 5, 6, 7, 8, 8]
        assert sum(r["calibrated"] != "" for r in sensor_rows) > 50
    assert {r["link"] for r in rows} == {"mqtt", "serial"}
    # The first node has no humidity sensor (PM10 only): the PM-only model calibrates it; the
    # others report rh and temp_c and get the covariate model, on the same topic.
    models = {s: {r["model"] for r in by_sensor[s] if r["calibrated"]} for s in SENSORS}
    assert models == {
        SENSORS[0]: {"test-tesla"},
        **{sensor: {"test-rh-temp"} for sensor in SENSORS[1:]},
    }
    assert "test-rh-temp" in summary
    assert (out / "demo-traces.png").stat().st_size > 10_000
    assert '"event": "gateway_stopped"' in (out / "gateway.log").read_text()


def test_demo_without_mosquitto_says_how_to_get_it(tmp_path: Path) -> None:
    result = run_demo("--mosquitto", str(tmp_path / "no-mosquitto"), "--out", str(tmp_path))
    assert result.returncode == 1
    assert "make setup" in result.stderr


def test_demo_without_a_model_names_the_directory(tmp_path: Path) -> None:
    result = run_demo("--model", str(tmp_path / "missing"), "--out", str(tmp_path))
    assert result.returncode == 1
    assert str(tmp_path / "missing") in result.stderr

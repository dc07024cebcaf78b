"""What an enclosure's warm, dry air does to the covariate model: measured on its test sensor.

The node's humidity sensor (the board's HTS221) reads the air inside the enclosure, warmed by
the board and the sun: warmer than outside by dT and, with the same water vapour, drier. The
covariate default was trained with the station's outdoor humidity and temperature. This script
runs the model's float graph (LiteRT, what the gateway runs) on every window of its test sensor
with the covariate channels as an enclosure would report them — temperature + dT, relative
humidity rh * e_s(T) / e_s(T + dT) (the same vapour pressure; Magnus formula over water) — and
compares with the unshifted windows and with the PM-only default on the same windows.
Writes docs/benchmarks/node-m4/enclosure.json (`make -C firmware m4-enclosure`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tesla_gateway.contract.manifest import Manifest, load_manifest  # noqa: E402

COVARIATE = "pm10-ispra-1min-rh-temp"
PM_ONLY = "pm10-ispra-1min"
DATASET, FOLDER = "ispra-1min", "ispra-1min"
WARMING = (0.5, 1.0, 2.0, 3.0, 5.0, 8.0)  # degC inside over outside
# The HTS221's stated accuracy (ST datasheet: +-3.5 %rH from 20 to 80 %rH, +-0.5 degC from 15 to
# 40 degC): one channel offset at a time, to see which of the two the model leans on.
OFFSETS = ((-3.5, 0.0), (3.5, 0.0), (0.0, 0.5), (0.0, -0.5))  # (rh points, degC)
HUMID = 70.0  # rh (%) above which the humidity correction matters most
Array = npt.NDArray[np.float32]


def saturation_hpa(temp_c: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Saturation vapour pressure over water (Magnus, Alduchov & Eskridge 1996)."""
    return 6.1094 * np.exp(17.625 * temp_c / (temp_c + 243.04))


def enclosed(windows: Array, warming: float) -> Array:
    """[B, N, 3] windows (pm, rh, temp_c) as the enclosure's sensor would read them."""
    out = windows.astype(np.float64).copy()
    temp = out[:, :, 2]
    out[:, :, 1] = out[:, :, 1] * saturation_hpa(temp) / saturation_hpa(temp + warming)
    out[:, :, 2] = temp + warming
    return out.astype(np.float32)


def predict(model_dir: Path, windows: Array) -> npt.NDArray[np.float64]:
    """The model's float graph on the windows, run as the gateway runs it."""
    from training.export import litert_predict

    graph = (model_dir / load_manifest(model_dir).files["float32"].path).read_bytes()
    return np.asarray(litert_predict(graph, windows), dtype=np.float64).reshape(-1)


def test_windows(manifest: Manifest) -> tuple[Array, npt.NDArray[np.float64]]:
    """Every complete window of the model's test sensor [B, N, 3] and its reference [B]."""
    from training.data import WindowSet, clean, default_data_dir, load_dataset, to_grid

    data = load_dataset(DATASET, default_data_dir() / FOLDER)
    only_test = data.with_frame(data.frame[data.frame["sensor_id"] == manifest.data.test_sensor])
    cleaned, _ = clean(only_test)
    windows = WindowSet.build(
        list(to_grid(cleaned).values()),
        manifest.window_length,
        manifest.gap_policy,
        channels=("raw", "rh", "temp_c"),
    )
    x, y = windows.gather(np.arange(len(windows)))
    return x, y.astype(np.float64)


def scores(predicted: npt.NDArray[np.float64], target: npt.NDArray[np.float64]) -> dict[str, float]:
    error = predicted - target
    return {
        "rmse": round(float(np.sqrt(np.mean(error**2))), 3),
        "bias": round(float(np.mean(error)), 3),
        "n": int(error.size),
    }


def main() -> int:
    covariate = ROOT / "models" / COVARIATE
    manifest = load_manifest(covariate)
    x, y = test_windows(manifest)
    humid = x[:, -1, 1] >= HUMID
    pm_only = predict(ROOT / "models" / PM_ONLY, np.ascontiguousarray(x[:, :, 0]))
    rows = []
    for warming in (0.0, *WARMING):
        shifted = enclosed(x, warming) if warming else x
        predicted = predict(covariate, shifted)
        rows.append(
            {
                "warming_c": warming,
                "rh_drop_median": round(float(np.median(x[:, -1, 1] - shifted[:, -1, 1])), 1),
                "all": scores(predicted, y),
                f"rh_at_least_{HUMID:g}": scores(predicted[humid], y[humid]),
            }
        )
    offsets = []
    for rh_points, degrees in OFFSETS:
        moved = x.copy()
        moved[:, :, 1] = np.clip(moved[:, :, 1] + rh_points, 0.0, 100.0)
        moved[:, :, 2] += degrees
        offsets.append(
            {"rh_points": rh_points, "temp_c": degrees, "all": scores(predict(covariate, moved), y)}
        )
    result = {
        "model": COVARIATE,
        "test_sensor": manifest.data.test_sensor,
        "windows": len(y),
        "rh_median": round(float(np.median(x[:, -1, 1])), 1),
        "temp_c_median": round(float(np.median(x[:, -1, 2])), 1),
        "pm_only": {
            "model": PM_ONLY,
            "all": scores(pm_only, y),
            f"rh_at_least_{HUMID:g}": scores(pm_only[humid], y[humid]),
        },
        "enclosure": rows,
        "sensor_offsets": offsets,
    }
    out = ROOT / "docs" / "benchmarks" / "node-m4" / "enclosure.json"
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

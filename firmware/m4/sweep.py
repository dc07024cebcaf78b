"""The paper's Figure 8 on the emulated node: RMSE, time per inference and FlatBuffer size over N.

Run by `make -C firmware m4-sweep`. For each N it trains a small TESLA on ispra-1min (3 epochs,
8,000 training windows, seed 0: a short training, so its RMSE is not the paper's), exports the
int8 device graph, builds the node firmware for it and measures it as bench.py does. Runs and
models go under firmware/build/sweep (not committed); the figures to
docs/benchmarks/node-m4/figure8/ (results.json, figure8.png).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import measure  # noqa: E402

WINDOWS = (15, 60, 360, 720, 1440)
TRAINING = ("--dataset", "ispra-1min", "--epochs", "3", "--max-train-windows", "8000")
WORK = ROOT / "firmware" / "build" / "sweep"
OUT = ROOT / "docs" / "benchmarks" / "node-m4" / "figure8"


def _training(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "training", *args], cwd=ROOT, check=True)  # noqa: S603


def model_for(window: int) -> tuple[str, Path]:
    """Trains and exports the N = ``window`` model unless its directory exists already."""
    name = f"pm10-ispra-1min-n{window}"
    run = WORK / "runs" / f"n{window}"
    model = WORK / "models" / name
    if not (run / "metrics.json").is_file():
        _training("train", *TRAINING, "--seed", "0", "--window", str(window), "--run-dir", str(run))
    if not (model / "manifest.json").is_file():
        _training("export", "--run", str(run), "--out", str(model), "--name", name)
    return name, run


def test_rmse_of_files(run: Path, model: Path) -> dict[str, float]:
    """RMSE of the float and int8 FlatBuffers (LiteRT) on every window of the test split."""
    import numpy as np

    from training.export import litert_predict
    from training.train import load_run, prepare_data

    config, _, _ = load_run(run)
    test = prepare_data(config).test
    windows, reference = test.gather(np.arange(len(test)))
    keep = np.isfinite(reference)
    rmse = {}
    for label, filename in (("float", "model.tflite"), ("int8", "model_int8.tflite")):
        predicted = litert_predict((model / filename).read_bytes(), windows)
        rmse[label] = float(np.sqrt(np.mean((predicted[keep] - reference[keep]) ** 2)))
    return rmse


def point(window: int) -> dict[str, object]:
    name, run = model_for(window)
    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    measured = measure(name, "cmsis-nn", WORK / "models")
    files = test_rmse_of_files(run, WORK / "models" / name)
    return {
        "window_length": window,
        "test_rmse_ug_m3": metrics["test"]["model"]["rmse"],
        "test_rmse_float_tflite_ug_m3": files["float"],
        "test_rmse_int8_tflite_ug_m3": files["int8"],
        "validation_rmse_ug_m3": metrics["validation"]["rmse"],
        "instructions_per_inference": measured["instructions_per_inference"],
        "ms_at_64mhz_1ipc": measured["ms_at_64mhz_1ipc"],
        "flatbuffer_bytes": measured["flatbuffer_bytes"],
        "arena_bytes": measured["arena_bytes"],
        "flash": measured["flash"],
        "ram": measured["ram"],
    }


def plot(points: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [p["window_length"] for p in points]
    rmse_float = [p["test_rmse_float_tflite_ug_m3"] for p in points]
    rmse_int8 = [p["test_rmse_int8_tflite_ug_m3"] for p in points]
    series = (
        ("test RMSE (µg/m³)", (("float", rmse_float), ("int8 (LiteRT)", rmse_int8))),
        ("ms per inference at 64 MHz", (("int8", [p["ms_at_64mhz_1ipc"] for p in points]),)),
        (
            "FlatBuffer (KB)",
            (("int8", [int(p["flatbuffer_bytes"]) / 1024 for p in points]),),  # type: ignore[call-overload]
        ),
    )
    figure, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for axis, (label, lines) in zip(axes, series, strict=True):
        for name, values in lines:
            axis.plot(n, values, marker="o", label=name)
        if len(lines) > 1:
            axis.legend()
        axis.set_xscale("log")
        axis.minorticks_off()
        axis.set_xticks(n, [str(v) for v in n])
        axis.set_xlabel("window length N (1-min readings)")
        axis.set_title(label)
        axis.grid(alpha=0.3)
    figure.suptitle(
        "TESLA int8 on the emulated Cortex-M4F (short training: 3 epochs, 8,000 windows)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main() -> int:
    windows = [int(arg) for arg in sys.argv[1:]] or list(WINDOWS)
    points = [point(window) for window in windows]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(points, indent=2) + "\n", encoding="utf-8")
    plot(points, OUT / "figure8.png")
    for p in points:
        print(json.dumps(p))
    return 0


if __name__ == "__main__":
    sys.exit(main())

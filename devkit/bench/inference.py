"""Calibration throughput through the gateway's own Calibrator: batched vs one invoke each."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.models.calibrator import Calibrator
from training.bench.litert import one_window
from training.bench.timing import best_rate, best_rates_interleaved

__all__ = ["InferenceResult", "device_graph_rate", "measure_inference", "realistic_windows"]


@dataclass(frozen=True)
class InferenceResult:
    sensors: int
    batched_per_s: float
    per_sensor_per_s: float

    @property
    def speedup(self) -> float:
        return self.batched_per_s / self.per_sensor_per_s


def realistic_windows(count: int, window_length: int, seed: int = 0) -> npt.NDArray[np.float32]:
    """PM-like windows: a per-sensor level with slow drift and multiplicative noise."""
    rng = np.random.default_rng(seed)
    level = rng.gamma(2.0, 15.0, size=(count, 1))
    drift = np.cumsum(rng.normal(0.0, 0.02, size=(count, window_length)), axis=1)
    noise = rng.lognormal(0.0, 0.1, size=(count, window_length))
    return (level * np.exp(drift) * noise).astype(np.float32)


def measure_inference(model_dir: Path, sensor_counts: tuple[int, ...]) -> list[InferenceResult]:
    """One batched invoke for all sensors vs one invoke per sensor, single-threaded.

    The per-sensor side has its own interpreter, which stays at batch 1 (no resizes). At one
    sensor both sides are the same single invoke, so both run on that interpreter: two
    interpreters of the same graph differed by up to 28 % at batch 1 (allocation of tensors of a
    few hundred bytes), which would be measured as a difference between the two methods.
    """
    batched = Calibrator.load(model_dir, num_threads=1)
    single = Calibrator.load(model_dir, num_threads=1)  # stays at batch 1: no resizes
    n = batched.manifest.window_length
    results = []
    for count in sensor_counts:
        windows = realistic_windows(count, n)
        rows = [windows[i : i + 1] for i in range(count)]
        grouped = single if count == 1 else batched

        def one_batch(w: npt.NDArray[np.float32] = windows, c: Calibrator = grouped) -> None:
            c.calibrate(w)

        def each_sensor(r: list[npt.NDArray[np.float32]] = rows) -> None:
            for row in r:
                single.calibrate(row)

        batched_rate, per_sensor_rate = best_rates_interleaved([one_batch, each_sensor], count)
        results.append(
            InferenceResult(
                sensors=count, batched_per_s=batched_rate, per_sensor_per_s=per_sensor_rate
            )
        )
    return results


def device_graph_rate(model_dir: Path) -> float:
    """Calibrations per second of the integer device graph (batch 1) under LiteRT."""
    manifest = load_manifest(model_dir)
    flatbuffer = (model_dir / manifest.files["int8"].path).read_bytes()
    run = one_window(flatbuffer, realistic_windows(1, manifest.window_length)[0], num_threads=1)
    return best_rate(run.invoke, 1)

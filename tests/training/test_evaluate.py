"""Evaluation scores a model directory through the gateway's Calibrator: what is served."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.errors import ModelIntegrityError
from tesla_gateway.models.calibrator import Calibrator
from training.data import generate_synthetic
from training.evaluate import evaluate_model_dir

MODEL = Path(__file__).resolve().parents[2] / "models" / "pm10-ispra-1min"


def test_evaluation_runs_the_calibrator_that_serves_the_model(monkeypatch) -> None:
    served: list[int] = []
    calibrate = Calibrator.calibrate

    def spy(self: Calibrator, windows: np.ndarray) -> np.ndarray:
        served.append(len(windows))
        return calibrate(self, windows)

    monkeypatch.setattr(Calibrator, "calibrate", spy)
    data = generate_synthetic(n_sensors=2, days=1.0, feature="pm10", seed=3)
    evaluation = evaluate_model_dir(MODEL, data)
    # Every scored window went through Calibrator.calibrate (beyond its load-time test invoke).
    assert sum(served) - 1 == len(evaluation.predictions) > 0
    assert evaluation.n > 0 and np.isfinite(evaluation.model.rmse)


def test_evaluation_refuses_what_the_gateway_refuses(tmp_path: Path) -> None:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for path in MODEL.iterdir():
        (model_dir / path.name).write_bytes(path.read_bytes())
    graph = model_dir / "model.tflite"
    graph.write_bytes(graph.read_bytes()[:-1] + b"\0")
    data = generate_synthetic(n_sensors=2, days=1.0, feature="pm10", seed=3)
    with pytest.raises(ModelIntegrityError):
        evaluate_model_dir(model_dir, data)

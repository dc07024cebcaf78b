"""Interpreter selection and the batched wrapper, on the real interpreters installed here."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tesla_gateway.models.runtime import BatchedInterpreter, RuntimeUnavailableError, select_runtime
from tests.support.models import ModelFactory


def test_litert_is_preferred_by_default() -> None:
    runtime = select_runtime()
    assert runtime.name == "ai_edge_litert"
    assert runtime.version != "unknown"


def test_unavailable_runtimes_are_skipped_in_preference_order() -> None:
    # tflite-runtime has no wheel for Python 3.11 on this machine: it is genuinely absent.
    runtime = select_runtime(["tflite_runtime", "ai_edge_litert"])
    assert runtime.name == "ai_edge_litert"


def test_no_runtime_available_names_each_reason() -> None:
    with pytest.raises(RuntimeUnavailableError, match="tflite_runtime: not installed"):
        select_runtime(["tflite_runtime"])


def test_tensorflow_lite_is_accepted_when_installed(model_factory: ModelFactory) -> None:
    model = model_factory.get()
    runtime = select_runtime(["tensorflow"])
    assert runtime.name == "tensorflow"
    interpreter = BatchedInterpreter(
        runtime.interpreter((model.path / "model.tflite").read_bytes())
    )
    windows = np.linspace(0, 80, 24, dtype=np.float32).reshape(3, 8)
    np.testing.assert_allclose(
        interpreter.run(windows), model.keras_predict(windows), rtol=1e-4, atol=1e-3
    )


def test_batched_interpreter_resizes_when_the_batch_changes(model_factory: ModelFactory) -> None:
    model = model_factory.get()
    runtime = select_runtime()
    interpreter = BatchedInterpreter(
        runtime.interpreter((model.path / "model.tflite").read_bytes())
    )
    assert interpreter.dynamic_batch
    rng = np.random.default_rng(1)
    for size in (1, 5, 5, 2, 9):
        windows = rng.uniform(0, 100, (size, 8)).astype(np.float32)
        np.testing.assert_allclose(
            interpreter.run(windows), model.keras_predict(windows), rtol=1e-4, atol=1e-3
        )


def test_importing_the_daemon_does_not_import_tensorflow() -> None:
    code = (
        "import sys, tesla_gateway.models.calibrator, tesla_gateway.daemon.ticker, "
        "tesla_gateway.models.watch, tesla_gateway.windows.snapshots, "
        "tesla_gateway.daemon.service, tesla_gateway.daemon.cli, tesla_gateway.daemon.config; "
        "tesla_gateway.models.runtime.select_runtime(); "
        "print('tensorflow' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", "import tesla_gateway.models.runtime; " + code],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.strip() == "False"

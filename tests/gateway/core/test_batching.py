"""Large batches run in fixed-size chunks and give exactly what one big invoke gives."""

from __future__ import annotations

import numpy as np
import pytest

from tesla_gateway.models.runtime import BatchedInterpreter, select_runtime
from tests.support.models import build_model_dir

MODEL_DIR_NAME = "chunked"


@pytest.fixture(scope="module")
def flatbuffer(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    model_dir = build_model_dir(tmp_path_factory.mktemp("m") / MODEL_DIR_NAME, window_length=8)
    return (model_dir.path / "model.tflite").read_bytes()


def _interpreter(flatbuffer: bytes, max_batch: int) -> BatchedInterpreter:
    return BatchedInterpreter(select_runtime().interpreter(flatbuffer, 1), max_batch=max_batch)


@pytest.mark.parametrize("size", [1, 6, 7, 8, 20, 100])
def test_chunked_equals_single_invoke(flatbuffer: bytes, size: int) -> None:
    windows = np.random.default_rng(size).gamma(2.0, 15.0, size=(size, 8)).astype(np.float32)
    whole = _interpreter(flatbuffer, max_batch=1024).run(windows)
    chunked = _interpreter(flatbuffer, max_batch=7).run(windows)
    assert chunked.shape == (size,)
    np.testing.assert_allclose(chunked, whole, rtol=1e-6, atol=1e-5)


def test_max_batch_must_be_positive(flatbuffer: bytes) -> None:
    with pytest.raises(ValueError, match="max_batch"):
        _interpreter(flatbuffer, max_batch=0)

"""The committed defaults carry the Keras weights ``train --init-from`` fine-tunes (a fresh clone
has no run directories), and they are exactly the weights of the committed FlatBuffers."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

import keras
import pytest

from tesla_gateway.contract.manifest import load_manifest
from training.export import FLOAT_TOLERANCE
from training.fine_tune import KERAS_FILENAME, init_weights, weights_error

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "models"
NAMES = sorted(p.parent.name for p in MODELS.glob("*/manifest.json"))


def test_every_default_is_checked() -> None:
    assert {"pm10-ispra-1min", "pm10-ispra-1min-rh-temp", "pm2_5-antwerp-1h"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_keras_weights_are_the_committed_flatbuffers(name: str) -> None:
    model_dir = MODELS / name
    manifest = load_manifest(model_dir)
    path = model_dir / KERAS_FILENAME
    assert path.is_file(), f"{name} has no {KERAS_FILENAME}: `--init-from` cannot fine-tune it"
    # beside the FlatBuffers, not among them: releases and OTA carry the listed files only
    assert KERAS_FILENAME not in {entry.path for entry in manifest.files.values()}
    assert path.stat().st_size < 128 * 1024  # no optimizer state, deflated
    model = keras.models.load_model(path)  # safe mode: refuses serialised code
    assert not model.compiled  # no optimizer state
    assert model.count_params() == manifest.parameter_count
    # Keras against LiteRT on the committed model.tflite, within the export's own tolerance
    assert weights_error(model, model_dir, manifest) <= FLOAT_TOLERANCE
    assert init_weights(model_dir, None, manifest) is not None  # what --init-from loads


def test_the_wheel_does_not_carry_the_keras_weights() -> None:
    """The gateway never loads them; the wheel's default models are the manifests and graphs."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["tesla_gateway.default_models"]
    assert not [p for p in patterns if fnmatch.fnmatch(f"{NAMES[0]}/{KERAS_FILENAME}", p)]
    assert [p for p in patterns if fnmatch.fnmatch(f"{NAMES[0]}/model.tflite", p)]

"""The committed defaults carry the Keras weights ``train --init-from`` fine-tunes (a fresh clone
has no run directories), and they are exactly the weights of the committed FlatBuffers."""

from __future__ import annotations

import fnmatch
import shutil
import tomllib
from pathlib import Path

import keras
import pytest

from tesla_gateway.contract.manifest import load_manifest
from training.export import FLOAT_TOLERANCE
from training.fine_tune import KERAS_FILENAME, InitFromError, init_weights, weights_error

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


def _wrong_keras_files(window: int, parameters: int) -> dict[str, tuple[bytes | keras.Model, str]]:
    """Files a damaged copy or an attacker could leave as ``model.keras``, each with what its
    refusal must say."""
    code_input = keras.Input((window,))
    inputs = keras.Input((parameters - 1,))  # as many parameters as the default, wider input
    return {
        "garbage": (b"PK\x03\x04 not a zip", "does not load"),
        "empty": (b"", "does not load"),
        # safe mode: a Lambda's Python code is never deserialised (unsafe, it would load and
        # then be refused for its parameter count, another message)
        "code": (
            keras.Model(code_input, keras.layers.Lambda(lambda x: x[:, -1:] * 2.0)(code_input)),
            "does not load .*Lambda",
        ),
        "another shape": (keras.Model(inputs, keras.layers.Dense(1)(inputs)), "windows of shape"),
    }


@pytest.mark.parametrize("case", ["garbage", "empty", "code", "another shape"])
def test_a_wrong_keras_file_is_refused_before_anything_is_trained(
    case: str, tmp_path: Path
) -> None:
    default = tmp_path / "default"
    shutil.copytree(MODELS / "pm2_5-antwerp-1h", default)
    manifest = load_manifest(default)
    wrong = _wrong_keras_files(manifest.window_length, manifest.parameter_count)
    content, refusal = wrong[case]
    if isinstance(content, bytes):
        (default / KERAS_FILENAME).write_bytes(content)
    else:
        content.save(default / KERAS_FILENAME)
    with pytest.raises(InitFromError, match=refusal):
        init_weights(default, None, manifest)


def test_the_wheel_does_not_carry_the_keras_weights() -> None:
    """The gateway never loads them; the wheel's default models are the manifests and graphs."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["tesla_gateway.default_models"]
    assert not [p for p in patterns if fnmatch.fnmatch(f"{NAMES[0]}/{KERAS_FILENAME}", p)]
    assert [p for p in patterns if fnmatch.fnmatch(f"{NAMES[0]}/model.tflite", p)]

"""Each contract rule lives once in ``tesla_gateway/``; the training
side and the config import it."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from tesla_gateway.contract import manifest, readings
from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.daemon import config
from tesla_gateway.ota.descriptor import ImageDescriptor
from training.bench import grid
from training.data import frame
from training.models import BASELINE_KINDS

DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "pm10-ispra-1min"


def test_feature_literal_is_the_readings_one() -> None:
    assert vars(config)["Feature"] is readings.Feature
    assert vars(manifest)["Feature"] is readings.Feature
    assert vars(frame)["Feature"] is readings.Feature


def test_covariates_are_named_once() -> None:
    assert vars(frame)["COVARIATES"] is readings.COVARIATES


def test_gateway_id_follows_the_readings_pattern(tmp_path: Path) -> None:
    field = config.GatewayConfig.model_fields["gateway_id"]
    patterns = [m.pattern for m in field.metadata if hasattr(m, "pattern")]
    assert patterns == [readings.GATEWAY_ID_PATTERN.pattern]
    assert re.compile(readings.GATEWAY_ID_PATTERN.pattern).fullmatch("roof-1.a_b")
    with pytest.raises(ValidationError, match="gateway_id"):
        config.GatewayConfig.model_validate(
            {"gateway_id": "-bad", "state_dir": tmp_path, "models": []}
        )


def test_the_paper_models_are_the_model_registrys_baselines_and_tesla() -> None:
    assert (*BASELINE_KINDS, "tesla") == grid.PAPER_MODELS
    assert not hasattr(grid, "BASELINE_MODELS")


def test_descriptor_of_an_image_is_built_from_its_manifest() -> None:
    model = load_manifest(DEFAULT_MODEL)
    image = (DEFAULT_MODEL / model.files["int8"].path).read_bytes()
    descriptor = ImageDescriptor.of_image(model, image, arena_bytes=1234)
    assert descriptor == ImageDescriptor(
        model_name=model.name,
        model_version=model.version,
        image_size=len(image),
        image_sha256=hashlib.sha256(image).digest(),
        window_length=model.window_length,
        arena_bytes=1234,
        min_history_periods=model.calibrates_from,
    )
    assert ImageDescriptor.decode(descriptor.encode()) == descriptor

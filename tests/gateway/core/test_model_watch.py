"""Hot reload: a new version is validated before it serves; a bad one never replaces the old."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import structlog

from tesla_gateway.models.watch import ModelSet, ReloadOutcome
from tests.support.models import ModelFactory, corrupt_model_file


def replace_dir(factory: ModelFactory, target: Path, **kwargs: object) -> None:
    shutil.rmtree(target)
    factory.copy(target, **kwargs)


def test_initial_load_then_nothing_changes(model_factory: ModelFactory, tmp_path: Path) -> None:
    model = model_factory.copy(tmp_path / "pm10")
    models = ModelSet({"pm10": model.path})
    assert models.get("pm10") is None
    [result] = models.refresh()
    assert (result.outcome, result.version) == (ReloadOutcome.LOADED, 1)
    assert models.refresh() == []
    [forced] = models.refresh(force=True)
    assert forced.outcome is ReloadOutcome.UNCHANGED
    calibrator = models.get("pm10")
    assert calibrator is not None and calibrator.version == 1


def test_new_version_is_swapped_in(model_factory: ModelFactory, tmp_path: Path) -> None:
    target = tmp_path / "pm10"
    model_factory.copy(target)
    models = ModelSet({"pm10": target})
    models.refresh()
    v2 = model_factory.get(version=2, seed=5)
    replace_dir(model_factory, target, version=2, seed=5)
    with structlog.testing.capture_logs() as logs:
        [result] = models.refresh()
    assert (result.outcome, result.version) == (ReloadOutcome.LOADED, 2)
    assert logs[0]["event"] == "model_loaded" and logs[0]["previous_version"] == 1
    calibrator = models.get("pm10")
    assert calibrator is not None
    window = np.full((1, 8), 42.0, dtype=np.float32)
    np.testing.assert_allclose(calibrator.calibrate(window), v2.keras_predict(window), atol=1e-3)
    assert models.stats()["pm10"]["reloads"] == 2


def test_corrupt_candidate_is_rejected_and_the_old_model_keeps_serving(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    target = tmp_path / "pm10"
    v1 = model_factory.copy(target)
    models = ModelSet({"pm10": target})
    models.refresh()
    replace_dir(model_factory, target, version=2, seed=5)
    corrupt_model_file(target)
    with structlog.testing.capture_logs() as logs:
        [result] = models.refresh()
    assert result.outcome is ReloadOutcome.REJECTED
    assert "sha256" in (result.error or "")
    assert logs[0]["event"] == "model_rejected" and logs[0]["serving_version"] == 1
    serving = models.get("pm10")
    assert serving is not None and serving.version == 1
    window = np.full((2, 8), 30.0, dtype=np.float32)
    np.testing.assert_allclose(serving.calibrate(window), v1.keras_predict(window), atol=1e-3)
    stats = models.stats()["pm10"]
    assert stats["rejected"] == 1 and "sha256" in str(stats["last_error"])
    assert models.refresh() == []  # the same broken files are not retried on every poll
    replace_dir(model_factory, target, version=2, seed=5)  # the operator copies it again
    [fixed] = models.refresh()
    assert (fixed.outcome, fixed.version) == (ReloadOutcome.LOADED, 2)
    assert models.stats()["pm10"]["last_error"] is None


def test_downgrade_and_wrong_feature_are_refused(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    target = tmp_path / "pm10"
    model_factory.copy(target, version=2, seed=5)
    models = ModelSet({"pm10": target})
    models.refresh()
    replace_dir(model_factory, target)  # version 1
    [result] = models.refresh()
    assert result.outcome is ReloadOutcome.REJECTED and "older" in (result.error or "")
    replace_dir(model_factory, target, feature="pm2_5", window_length=5, seed=3)
    [result] = models.refresh()
    assert result.outcome is ReloadOutcome.REJECTED and "pm2_5" in (result.error or "")
    serving = models.get("pm10")
    assert serving is not None and serving.version == 2


def test_missing_model_dir_is_reported_until_it_appears(
    model_factory: ModelFactory, tmp_path: Path
) -> None:
    target = tmp_path / "later"
    models = ModelSet({"pm10": target})
    [result] = models.refresh()
    assert result.outcome is ReloadOutcome.REJECTED
    model_factory.copy(target)
    [result] = models.refresh()
    assert result.outcome is ReloadOutcome.LOADED

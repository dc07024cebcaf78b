"""The candidates' level search (training/interval_candidates.py) on synthetic units."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest

from training.cross_conformal import UnitResiduals
from training.errors import DataError
from training.interval_candidates import (
    _unit_folds_row,
    held_out,
    level_for_mean_coverage,
    nested_level_held_out,
)
from training.train import TrainConfig


def unit(name: str, scale: float, seed: int) -> UnitResiduals:
    rng = np.random.default_rng(seed)
    predicted = rng.uniform(5.0, 60.0, 800)
    return UnitResiduals(name, "train", predicted, predicted + scale * rng.normal(size=800))


def test_the_level_is_the_one_whose_held_out_mean_coverage_is_the_target() -> None:
    # units this different under-cover one another at 90 %: the level must rise to compensate
    units = [unit(f"u{i}", scale, i) for i, scale in enumerate((0.6, 1.0, 1.4, 2.2, 1.0))]
    assert np.mean(held_out(units, 0.9)) < 0.88
    level = level_for_mean_coverage(units)
    assert level > 0.9
    assert np.mean(held_out(units, level)) == pytest.approx(0.9, abs=0.01)
    nested = nested_level_held_out(units)
    assert len(nested) == len(units) and all(0.5 <= lv <= 0.995 for lv, _, _ in nested)
    # the unit scored never chooses its level: its own errors do not change it
    wilder = [*units[:4], unit("u4", 5.0, 4)]
    assert nested_level_held_out(wilder)[4][0] == nested[4][0]


def test_without_earlier_folds_the_unit_folds_row_is_left_out_with_a_note(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing trains the earlier ``without-*-seed*`` folds any more: on a fresh clone the
    comparison used to stop there. Some of them present, but not for every unit, still stops."""
    config = TrainConfig(dataset="synthetic", window_length=8)
    validation, test = unit("v", 1.0, 7), unit("t", 1.0, 8)
    windows = {"a": None, "b": None}
    assert _unit_folds_row(tmp_path, config, windows, validation, test) is None
    assert "unit-folds candidate is left out" in capsys.readouterr().err
    run = tmp_path / "without-a-seed0"
    run.mkdir()
    left_out = config.model_copy(update={"left_out_sensors": ("a",)})
    (run / "config.json").write_text(left_out.model_dump_json())
    (run / "metrics.json").write_text(json.dumps({"validation": {"rmse": 1.0}}))
    keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)]).save(run / "model.keras")
    with pytest.raises(DataError, match=r"left out \['b'\]"):
        _unit_folds_row(tmp_path, config, windows, validation, test)

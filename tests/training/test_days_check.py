"""The leave-days-out check: its blocks never score a trained moment or one within the margin,
and the command runs end to end on synthetic data (numbers on it say nothing about sensors)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from training.days_check import DAY_S, DayBlocks, check_points, default_blocks, refuse_diverged
from training.errors import DataError, DivergedTrainingError

_CASES = [(1, 6 * 3600, 60), (7, DAY_S, 3600), (2, 3 * 3600, 300), (3, 0, 60)]


@pytest.mark.parametrize(("days", "margin", "period"), _CASES)
def test_no_scored_target_lies_within_the_margin_of_a_trained_one(
    days: int, margin: int, period: int
) -> None:
    blocks = DayBlocks(period_days=days, margin_s=margin)
    # every period of four blocks pairs, from an origin that is not a block boundary
    start = 1_600_000_000 // period * period
    t = np.arange(start, start + 8 * days * DAY_S, period, dtype=np.int64)
    trained, scored, control = (
        blocks.trained(t),
        blocks.scored(t, period),
        blocks.control(t, period),
    )
    assert trained.any() and scored.any() and control.any()
    assert not (scored & trained).any()
    assert not (control & ~trained).any()
    taught = t[trained]
    # least distance, in period starts, from each scored target to any trained one
    position = np.searchsorted(taught, t[scored])
    before = taught[np.clip(position - 1, 0, taught.size - 1)]
    after = taught[np.clip(position, 0, taught.size - 1)]
    nearest = np.minimum(np.abs(t[scored] - before), np.abs(after - t[scored]))
    assert nearest.min() >= margin + period
    # the control mirrors the scored periods: the same offsets inside the block
    assert set(t[scored] % blocks.length_s) == set(t[control] % blocks.length_s)


def test_blocks_refuse_a_margin_that_leaves_nothing_to_score() -> None:
    with pytest.raises(DataError, match="leaves nothing"):
        DayBlocks(period_days=1, margin_s=12 * 3600)


def test_a_diverged_run_is_refused_not_scored_over_no_window() -> None:
    """error_metrics scores NaN predictions as RMSE 0 over n = 0: the check must refuse them."""
    config = SimpleNamespace(seed=2, learning_rate=3e-4)
    refuse_diverged([40.0, 12.0], config)
    with pytest.raises(DivergedTrainingError, match="epoch 2"):
        refuse_diverged([40.0, float("nan")], config)


def test_defaults_and_points_follow_the_period() -> None:
    assert default_blocks(60) == DayBlocks(period_days=1, margin_s=6 * 3600)
    assert default_blocks(3600) == DayBlocks(period_days=7, margin_s=DAY_S)
    assert check_points(360, 60) == (1, 60, 180, 360)
    assert check_points(168, 3600) == (1, 3, 24, 168)


def test_the_command_runs_end_to_end_on_synthetic_data(tmp_path: Path) -> None:
    from training.cli import main

    config = {
        "dataset": "synthetic",
        "dataset_options": {"n_sensors": 3, "days": 4, "period_seconds": 300, "seed": 3},
        "window_length": 12,
        "max_interpolated_periods": 6,
        "model": {"kind": "tesla", "d_model": 8, "heads": 2},
        "epochs": 1,
        "batch_size": 64,
        "partial_history_fraction": 0.5,
        "partial_history_epochs": 1,
    }
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    out, table = tmp_path / "r.json", tmp_path / "r.md"
    argv = ["days-check", str(path), "--seed", "1", "--out", str(out), "--table", str(table)]
    assert main([*argv, "--quiet"]) == 0
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["blocks"] == {"period_days": 1, "margin_hours": 6.0}
    assert report["points"] == [1, 12]
    assert report["training"]["windows"] < report["training"]["of_windows"]
    assert "fine_tune_chosen_epoch" in report["training"]
    assert set(report["scores"]) == {
        "validation-untrained",
        "validation-trained",
        "test-untrained",
        "test-trained",
    }
    for score in report["scores"].values():
        assert score["n"] > 0
        assert all(np.isfinite(v) and v > 0 for v in score["model"].values())
        assert score["linear"] < score["raw"]
    assert "| test | untrained" in table.read_text(encoding="utf-8")

"""Intervals across units: the unit-weighted conformal widths, leave-one-unit-out figures, the
folds exchangeable with the exported model and ``calibrate-intervals`` on a real (small,
synthetic) model directory."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.errors import ManifestError
from training.cli import main
from training.cross_conformal import (
    UnitResiduals,
    fit_cross_unit,
    held_out_coverage,
    replay_adaptive,
    unit_scores,
)
from training.data import generate_synthetic
from training.errors import DataError
from training.evaluate import evaluate_model_dir, evaluation_text
from training.intervals_cli import fold_epochs
from training.model_dir import export_run
from training.models import TeslaConfig
from training.pool_folds import FOLD_FILE, KeptEpochs, kept_epochs, recorded_epochs
from training.train import TrainConfig, train


def unit(name: str, scale: float, n: int, seed: int, bias: float = 0.0) -> UnitResiduals:
    rng = np.random.default_rng(seed)
    predicted = rng.uniform(5.0, 60.0, n)
    return UnitResiduals(name, "train", predicted, predicted + bias + scale * rng.normal(size=n))


def test_every_unit_weighs_the_same_however_many_pairs_it_has() -> None:
    small_errors = unit("big", 1.0, 20_000, 0)
    large_errors = unit("small", 3.0, 1_000, 1)
    fitted = fit_cross_unit([small_errors, large_errors], validation_sensor="big")
    pooled = np.quantile(
        np.abs(np.concatenate([u.reference - u.predicted for u in (small_errors, large_errors)])),
        0.9,
    )
    # pooled by pairs the big unit would set the width (about 1.9); as units, both count
    assert min(fitted.half_widths) > 1.3 * pooled
    scores = [unit_scores(fitted, u) for u in (small_errors, large_errors)]
    assert np.mean([s.coverage for s in scores]) == pytest.approx(0.9, abs=0.02)
    assert fitted.method == "cross_unit_conformal_binned"
    assert fitted.calibration_sensors == ["big", "small"] and fitted.calibration_sensor == "big"


def test_the_quantile_table_holds_the_level_and_grows() -> None:
    fitted = fit_cross_unit(
        [unit(f"u{i}", 1.0 + i / 4, 3000, i) for i in range(4)], validation_sensor="u3"
    )
    assert 0.9 in fitted.quantile_levels
    row = fitted.quantile_half_widths[fitted.quantile_levels.index(0.9)]
    assert row == fitted.half_widths
    for lower, upper in itertools.pairwise(fitted.quantile_half_widths):
        assert all(a <= b for a, b in zip(lower, upper, strict=True))
    assert len(fitted.half_widths) == 5 and sum(fitted.counts) == 12_000


def test_held_out_units_are_scored_without_their_own_residuals() -> None:
    units = [unit(f"u{i}", 1.0, 3000, i) for i in range(4)] + [unit("odd", 1.0, 3000, 9, 4.0)]
    figures = {f.sensor: f for f in held_out_coverage(units, validation_sensor="u0")}
    assert figures["odd"].coverage < 0.6  # its bias is in no other unit's residuals
    assert all(figures[f"u{i}"].coverage > 0.85 for i in range(4))
    assert figures["odd"].n == 3000 and figures["odd"].mean_width > 0


def test_one_unit_is_not_across_units() -> None:
    with pytest.raises(DataError, match="at least 2 units"):
        fit_cross_unit([unit("a", 1.0, 500, 0)], validation_sensor="a")


def test_the_folds_train_for_the_epochs_the_exported_weights_are_from(tmp_path: Path) -> None:
    """Early stopping restores the best validation epoch and the fine-tuning keeps its chosen
    epoch: a fold trained for the run's *last* epochs would not be the exported model's peer."""
    history = {"loss": [9.0] * 7, "val_loss": [5.0, 4.0, 3.0, 3.5, float("nan"), 3.2, 3.1]}
    (tmp_path / "history.json").write_text(json.dumps({**history, "fine_tune_chosen_epoch": [4.0]}))
    assert kept_epochs(tmp_path) == KeptEpochs(epochs=3, fine_tune_epochs=4)
    (tmp_path / "history.json").write_text(json.dumps(history))  # mixed from the start
    assert kept_epochs(tmp_path) == KeptEpochs(epochs=3, fine_tune_epochs=0)
    (tmp_path / "history.json").write_text("{}")
    with pytest.raises(DataError, match="--fold-epochs"):
        kept_epochs(tmp_path)


def test_a_fold_trains_on_the_windows_the_exported_model_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``max_train_windows`` the exported model trains on a seeded sample of its windows;
    a fold that trained on all of them (as it did) would see several times more batches per
    epoch than its peer. The batches per epoch are counted on the real fit."""
    from training import pool_folds

    config = TrainConfig(
        dataset="synthetic",
        dataset_options={"n_sensors": 3, "days": 1, "period_seconds": 60, "seed": 2},
        window_length=16,
        max_interpolated_periods=10,
        model=TeslaConfig(d_model=8, heads=2),
        batch_size=32,
        max_train_windows=96,
        seed=5,
    )
    pool = sorted(pool_folds._grid(config))
    seen: list[int] = []
    fit = pool_folds._fit

    def counting_fit(model: Any, batches: Any, epochs: int, verbose: int | str) -> list[float]:
        seen.append(len(batches))
        return fit(model, batches, epochs, verbose)

    monkeypatch.setattr(pool_folds, "_fit", counting_fit)
    [fold] = pool_folds.train_pool_folds(
        config, pool, pool[:1], KeptEpochs(epochs=1), tmp_path, verbose=0
    )
    assert fold.train_units == tuple(pool[1:])
    assert seen == [96 // 32]  # one phase (no partial-history epochs), three batches
    assert (fold.run_dir / "model.keras").is_file()


def test_the_fold_epochs_come_from_the_flags_the_run_or_the_folds_already_trained(
    tmp_path: Path,
) -> None:
    """A manifest exported before it recorded its epochs: the run's or the folds' are used."""
    old = load_manifest(MODELS / "pm2_5-antwerp-1h").model_copy(update={"trained_epochs": None})
    run, folds = tmp_path / "run", tmp_path / "folds"
    with pytest.raises(DataError, match="--fold-epochs E"):
        fold_epochs(None, 0, None, folds, manifest=old)  # a default whose run is gone, no folds
    assert fold_epochs(7, 2, run, folds, manifest=old) == KeptEpochs(epochs=7, fine_tune_epochs=2)
    run.mkdir()
    (run / "history.json").write_text(json.dumps({"loss": [1, 1], "val_loss": [2.0, 1.0]}))
    assert fold_epochs(None, 0, run, folds, manifest=old) == KeptEpochs(epochs=2)
    record = {"config": TrainConfig(dataset="synthetic").model_dump(mode="json"),
              "train_units": ["a", "c"], "left_out": "b",
              "kept": {"epochs": 5, "fine_tune_epochs": 1}}  # fmt: skip
    for left_out in ("a", "b"):
        (folds / f"pool-without-{left_out}-e5+1-seed0").mkdir(parents=True)
        (folds / f"pool-without-{left_out}-e5+1-seed0" / FOLD_FILE).write_text(json.dumps(record))
    assert fold_epochs(None, 0, None, folds, manifest=old) == KeptEpochs(
        epochs=5, fine_tune_epochs=1
    )
    other = {**record, "kept": {"epochs": 6, "fine_tune_epochs": 1}}
    (folds / "pool-without-b-e5+1-seed0" / FOLD_FILE).write_text(json.dumps(other))
    assert recorded_epochs(folds) is None  # folds of two trainings: which is the model's?


@pytest.mark.slow
def test_export_and_calibrate_intervals_fit_intervals_across_units(tmp_path: Path) -> None:
    config = TrainConfig(
        dataset="synthetic",
        # a test sensor, a validation sensor and two trained on: two folds, each a training
        dataset_options={"n_sensors": 4, "days": 2, "period_seconds": 60, "seed": 3},
        window_length=32,
        max_interpolated_periods=10,
        model=TeslaConfig(d_model=8, heads=2),
        epochs=2,
        batch_size=64,
        learning_rate=3e-3,
        partial_history_fraction=0.5,
    )
    run_dir = tmp_path / "run"
    train(config, run_dir, verbose=0)
    model_dir = tmp_path / "model"
    split = export_run(run_dir, tmp_path / "split", name="pm2_5-synthetic", force=True).manifest
    assert split.intervals is not None and split.intervals.method == "split_conformal_binned"
    assert split.history_intervals is not None
    # export --intervals-across-units: the folds are trained beside the run
    export = ["export", "--run", str(run_dir), "--out", str(model_dir), "--name", "pm2_5-synthetic"]
    assert main([*export, "--force", "--intervals-across-units"]) == 0
    folds_dir = run_dir / "interval-folds"
    stamps = {p: p.stat().st_mtime_ns for p in folds_dir.glob("*/model.keras")}
    summary = split.data
    assert len(stamps) == len(summary.train_sensors)  # one fold per training sensor
    kept = kept_epochs(run_dir)
    for path in folds_dir.glob(f"*/{FOLD_FILE}"):
        # each fold is the exported model's peer: as many units (the validation sensor in
        # place of the one left out), its config and seed, its kept epochs
        fold = json.loads(path.read_text())
        assert summary.validation_sensor in fold["train_units"]
        assert fold["left_out"] not in fold["train_units"]
        assert sorted([*fold["train_units"], fold["left_out"]]) == sorted(
            [*summary.train_sensors, summary.validation_sensor]
        )
        assert KeptEpochs.model_validate(fold["kept"]) == kept
        assert TrainConfig.model_validate(fold["config"]) == config
    args = ["calibrate-intervals", "--model", str(model_dir), "--run", str(run_dir)]
    args += ["--folds-dir", str(folds_dir), "--report", str(tmp_path / "r.json")]
    assert main(args) == 0  # calibrating again reuses the folds: no run is written again
    assert {p: p.stat().st_mtime_ns for p in folds_dir.glob("*/model.keras")} == stamps
    after = load_manifest(model_dir)
    intervals = after.intervals
    assert intervals is not None and intervals.method == "cross_unit_conformal_binned"
    assert after.data == summary
    assert sorted(intervals.calibration_sensors) == sorted(
        [*summary.train_sensors, summary.validation_sensor]
    )
    roles = {c.sensor: c.role for c in intervals.unit_coverage}
    assert roles[summary.test_sensor] == "test" and roles[summary.validation_sensor] == "validation"
    assert all(roles[s] == "train" for s in summary.train_sensors)
    assert all(0 <= c.coverage <= 1 and c.n > 0 for c in intervals.unit_coverage)
    assert after.history_intervals is not None
    assert [h.min_periods for h in after.history_intervals] == [
        h.min_periods for h in split.history_intervals
    ]
    assert {h.intervals.method for h in after.history_intervals} == {"cross_unit_conformal_binned"}
    assert after.validation == split.validation  # the same model, other intervals
    report = json.loads((tmp_path / "r.json").read_text())
    assert sorted(f["left_out"][0] for f in report["folds"]) == sorted(summary.train_sensors)
    assert report["fold_epochs"] == kept.model_dump()
    assert {r["sensor"] for r in report["units"]} == set(roles)

    # --fold-epochs: folds of other epochs are trained beside (and recorded), not mixed up
    assert main([*args, "--fold-epochs", "1", "--fold-fine-tune-epochs", "0"]) == 0
    assert len(list(folds_dir.glob("pool-without-*-e1+0-seed*/model.keras"))) == len(stamps)

    # evaluate names every unit's coverage with its role
    data = generate_synthetic(**config.dataset_options)  # type: ignore[arg-type]
    evaluation = evaluate_model_dir(model_dir, data)
    assert evaluation.intervals_per_sensor is not None
    assert set(evaluation.intervals_per_sensor) == set(roles)
    text = evaluation_text(after, evaluation)
    assert f"{summary.test_sensor} (test):" in text and "(trained on):" in text
    per_unit = evaluation.as_json()["sensors"]
    assert per_unit[summary.test_sensor]["intervals"]["n"] > 0  # type: ignore[index]


def test_replaying_a_units_pairs_through_the_gateways_aci_brings_it_to_the_level() -> None:
    calibrated_on = [unit(f"u{i}", 1.0, 3000, i) for i in range(3)]
    fitted = fit_cross_unit(calibrated_on, validation_sensor="u0")
    wider = unit("wide", 1.4, 8000, 7)
    assert unit_scores(fitted, wider).coverage < 0.82
    adapted = replay_adaptive(fitted, wider, gamma=0.005)
    assert adapted.coverage == pytest.approx(0.9, abs=0.01)
    assert adapted.mean_width > unit_scores(fitted, wider).mean_width


MODELS = Path(__file__).resolve().parents[2] / "models"


def _absurd_manifests() -> dict[str, dict[str, object]]:
    """Interval documents a tampered or broken export could carry, each beside the committed
    default's own intervals (which load)."""
    levels, table = [0.5, 0.9], [[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 3.0, 4.0, 5.0, 6.0]]
    return {
        "a single negative row": {"quantile_levels": [0.9], "quantile_half_widths": [[-1.0] * 5]},
        "a negative last row": {"quantile_levels": levels, "quantile_half_widths": [
            table[0], [-1.0] * 5]},
        "an infinite last row": {"quantile_levels": levels, "quantile_half_widths": [
            table[0], [1e400] * 5]},
        "unsorted levels": {"quantile_levels": [0.9, 0.5], "quantile_half_widths": table},
        "levels outside (0, 1)": {"quantile_levels": [0.5, 1.5], "quantile_half_widths": table},
        "widths shrinking with level": {"quantile_levels": levels,
                                         "quantile_half_widths": table[::-1]},
        "a negative half-width": {"half_widths": [-1.0, 1.0, 1.0, 1.0, 1.0]},
        "a negative count": {"counts": [-5, 5, 5, 5, 5]},
        "a huge table": {"edges": [float(e) for e in range(1, 100_000)],
                         "half_widths": [1.0] * 100_000, "counts": [1] * 100_000,
                         "quantile_levels": [], "quantile_half_widths": []},
        "too many levels": {"quantile_levels": [i / 1001 for i in range(1, 1001)],
                            "quantile_half_widths": [[1.0] * 5] * 1000},
    }  # fmt: skip


@pytest.mark.parametrize("case", sorted(_absurd_manifests()))
def test_a_manifest_with_absurd_intervals_is_refused(case: str, tmp_path: Path) -> None:
    manifest = json.loads((MODELS / "pm2_5-antwerp-1h" / "manifest.json").read_text())
    assert len(manifest["intervals"]["edges"]) == 4  # five bins, as the cases assume
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert load_manifest(tmp_path).intervals is not None
    manifest["intervals"].update(_absurd_manifests()[case])
    (tmp_path / "manifest.json").write_text(json.dumps(manifest).replace("Infinity", "1e400"))
    with pytest.raises(ManifestError, match=r"intervals"):
        load_manifest(tmp_path)


@pytest.mark.parametrize(
    ("damage", "reused"),
    [
        ({}, True),
        ({FOLD_FILE: '{"config": {"data'}, False),  # killed while writing the record
        ({FOLD_FILE: '{"no_such_field": 1}'}, False),  # another version's record
        ({"model.keras": "PK"}, False),  # a model archive cut short
    ],
)
def test_a_fold_run_cut_short_is_trained_again_not_reused(
    damage: dict[str, str], reused: bool, tmp_path: Path
) -> None:
    """A fold run is reused only whole: a kill or a full disk mid-write used to leave a run that
    every later ``calibrate-intervals`` took as finished and then failed on."""
    import zipfile

    from training.pool_folds import DIVERGED_FILE, _diverged, _finished, _FoldRecord

    config = TrainConfig(dataset="synthetic", window_length=8)
    record = _FoldRecord(config=config, train_units=("a", "c"), left_out="b",
                         kept=KeptEpochs(epochs=3))  # fmt: skip
    with zipfile.ZipFile(tmp_path / "model.keras", "w") as archive:
        archive.writestr("config.json", "{}")
    done = record.model_copy(update={"train_seconds": 1.0, "final_loss": 2.0})
    (tmp_path / FOLD_FILE).write_text(done.model_dump_json())
    for name, text in damage.items():
        (tmp_path / name).write_text(text)
    assert (_finished(tmp_path, record) is not None) is reused
    assert _finished(tmp_path, record.model_copy(update={"kept": KeptEpochs(epochs=4)})) is None
    # a divergence marker cut short says nothing: the seed is tried again
    assert not _diverged(tmp_path, record)
    (tmp_path / DIVERGED_FILE).write_text('{"config": {"data')
    assert not _diverged(tmp_path, record)
    (tmp_path / DIVERGED_FILE).write_text(record.model_dump_json())
    assert _diverged(tmp_path, record)


@pytest.mark.parametrize("field", ["candidates", "choice"])
def test_a_manifest_with_an_absurd_ladder_report_is_refused(field: str, tmp_path: Path) -> None:
    """The ladder's report travels in the manifest: a flood of candidates or a megabyte of
    'choice' is refused at load, like an absurd interval table."""
    manifest = json.loads((MODELS / "pm2_5-antwerp-1h" / "manifest.json").read_text())
    candidate = {"name": "linear", "architecture": "classical-linear",
                 "input_channels": ["pm2_5"], "parameters": 2}  # fmt: skip
    sane = {"candidates": [candidate] * 6, "choice": "linear has the lowest RMSE " * 10}
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, **sane}))
    assert load_manifest(tmp_path).candidates is not None
    absurd = {"candidates": [candidate] * 10_000, "choice": "x" * 1_000_000}[field]
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, field: absurd}))
    with pytest.raises(ManifestError, match=field):
        load_manifest(tmp_path)

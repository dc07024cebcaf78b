"""The benchmark's budget: valid grids plan the right cells, invalid input fails clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.bench.grid import (
    ABLATION_CHAIN,
    MODELS,
    PAPER_MODELS,
    BenchConfig,
    BenchConfigError,
    SweepConfig,
    load_bench_config,
)
from training.cli import main
from training.models import TeslaConfig


def test_defaults_are_the_papers_grid() -> None:
    config = BenchConfig()
    assert config.window_length == 360
    assert config.epochs == 10
    assert config.batch_size == 32
    assert config.sweep.windows == (15, 60, 360, 720, 1440)
    assert set(PAPER_MODELS) <= set(config.grid_models)
    for model, *_ in ABLATION_CHAIN:  # the cumulative ablation needs every row it compares
        assert model in config.grid_models
    assert {"tesla+rh", "tesla+rh+t"} <= set(config.grid_models)


def test_variants_are_configurations_of_the_one_tesla() -> None:
    assert MODELS["tesla-uniform-bins"].model == TeslaConfig(bins="uniform")
    assert MODELS["tesla-local-only"].model == TeslaConfig(use_global=False)
    assert MODELS["tesla-ffn-aggregator"].model == TeslaConfig(aggregator="ffn")
    assert MODELS["tesla+rh+t"].model == TeslaConfig()
    assert MODELS["tesla+rh+t"].channels == ("raw", "rh", "temp_c")
    assert not MODELS["ols"].learned


def test_cells_share_the_main_window_with_the_sweep() -> None:
    config = BenchConfig(
        models=("tesla", "dlinear"),
        ablations=False,
        covariates=False,
        seeds=(0, 1),
        sweep=SweepConfig(windows=(15, 360), models=("tesla",)),
    )
    spec = config.datasets[0]
    cells = list(config.cells(spec))
    labels = [(c.model, c.window_length, c.seed) for c in cells]
    assert len(labels) == len(set(labels))
    assert sorted(labels) == sorted(
        [("tesla", 360, 0), ("tesla", 360, 1), ("dlinear", 360, 0), ("dlinear", 360, 1),
         ("tesla", 15, 0), ("tesla", 15, 1)]
    )  # fmt: skip
    assert all(c.full for c in cells if c.window_length == 360)
    assert not any(c.full for c in cells if c.window_length == 15)
    assert [c.model for c in config.reference_cells(spec)] == ["raw", "ols", "epa"]
    assert len({c.file_name for c in cells}) == len(cells)


def test_cells_run_seed_by_seed_with_deferred_models_last() -> None:
    """A long run stopped early leaves whole seeds, and the slow models never block the rest."""
    from training.bench.runner import compute_order

    config = BenchConfig(
        models=("transformer", "tesla", "dlinear"),
        ablations=False,
        covariates=False,
        seeds=(0, 1),
        sweep=SweepConfig(enabled=False),
    )
    spec_a, spec_b = (*config.datasets, *config.datasets)[:2]
    queue = [(spec, None, cell, "") for spec in (spec_a, spec_b) for cell in config.cells(spec)]
    ordered = [(e[2].model, e[2].seed or 0) for e in compute_order(queue, config.seeds)]
    assert [seed for _, seed in ordered] == sorted(seed for _, seed in ordered)
    assert ordered[:3] == [("transformer", 0), ("tesla", 0), ("dlinear", 0)]
    deferred = [
        (e[2].model, e[2].seed or 0) for e in compute_order(queue, config.seeds, ["transformer"])
    ]
    assert [m for m, _ in deferred[-4:]] == ["transformer"] * 4
    assert [s for _, s in deferred[-4:]] == [0, 0, 1, 1]
    assert [s for m, s in deferred if m != "transformer"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert sorted(deferred) == sorted(ordered)


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"models": ["tesla", "lstm"]}, "unknown model 'lstm'"),
        ({"models": ["raw"]}, "reference row"),
        ({"datasets": [{"dataset": "oslo"}]}, "unknown dataset 'oslo'"),
        ({"seeds": []}, "seeds"),
        ({"seeds": [1, 1]}, "seeds"),
        ({"epochs": 0}, "epochs"),
        ({"sweep": {"windows": [1, 60]}}, "sweep windows"),
        ({"sweep": {"models": ["ols"]}}, "sweep.models"),
        ({"epoch": 3}, "epoch: Extra inputs are not permitted"),
        ({"max_train_windows": -5}, "max_train_windows"),
        (
            {"datasets": [{"dataset": "ispra-1min"}, {"dataset": "ispra-1min"}]},
            "ids must be unique",
        ),
        ({"models": [], "ablations": False, "covariates": False}, "no learned model"),
    ],
)
def test_bad_budget_is_rejected_with_the_field_named(
    payload: dict[str, object], message: str
) -> None:
    with pytest.raises(BenchConfigError, match="invalid bench config") as caught:
        load_bench_config(payload)
    assert message in str(caught.value)


def test_unreadable_config_file(tmp_path: Path) -> None:
    broken = tmp_path / "bench.json"
    broken.write_text("{not json", encoding="utf-8")
    with pytest.raises(BenchConfigError, match="cannot read the bench config"):
        load_bench_config(broken)


def test_cli_reports_bad_budget_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["bench", "--report-dir", str(tmp_path), "--models", "tesla,gpt", "--no-progress"])
    assert code == 2
    error = capsys.readouterr().err
    assert "error: invalid bench config" in error
    assert "unknown model 'gpt'" in error
    assert not (tmp_path / "cells").exists()


def test_cli_validate_config_prints_the_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["bench", "--report-dir", str(tmp_path), "--validate-config", "--models", "tesla",
         "--no-ablations", "--no-covariates", "--sweep-windows", "15,60", "--sweep-models",
         "tesla", "--epochs", "3", "--max-train-windows", "8000"]
    )  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "ispra-1min N=360 tesla seed 0" in out
    assert "ispra-1min N=15 tesla seed 0" in out
    assert '"max_train_windows": 8000' in out

"""The bench command end to end on a tiny synthetic grid, and its resumability.

One module-scoped run (two models, the reference rows, a three-N sweep of which one N has no
valid window) writes a report directory; a second invocation must recompute nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from training.bench.flops import count_flops, resolve_graph
from training.bench.grid import BenchConfig, DatasetSpec, SweepConfig
from training.bench.progress import Progress
from training.bench.runner import BenchSummary, run_bench
from training.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONFIG = BenchConfig(
    datasets=(
        DatasetSpec(
            dataset="synthetic",
            options={"n_sensors": 4, "days": 1, "seed": 5},
            max_interpolated_periods=10,
        ),
    ),
    models=("tesla", "dlinear"),
    ablations=False,
    covariates=False,
    window_length=32,
    sweep=SweepConfig(windows=(16, 32, 5000), models=("dlinear",)),
    epochs=1,
    max_train_windows=256,
    case_study_models=("tesla",),
    case_study_periods=60,
)


@dataclass(frozen=True)
class Runs:
    report_dir: Path
    work_dir: Path
    first: BenchSummary
    second: BenchSummary
    cells_after_first: dict[str, bytes]
    cells_after_second: dict[str, bytes]


def _cells(report_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((report_dir / "cells").glob("*.json"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    report_dir = tmp_path_factory.mktemp("report")
    work_dir = tmp_path_factory.mktemp("work")
    first = run_bench(CONFIG, report_dir, work_dir=work_dir, progress=False)
    after_first = _cells(report_dir)
    second = run_bench(CONFIG, report_dir, work_dir=work_dir, progress=False)
    return Runs(report_dir, work_dir, first, second, after_first, _cells(report_dir))


def _results(runs: Runs) -> dict[str, dict[str, Any]]:
    payload = json.loads((runs.report_dir / "results.json").read_text(encoding="utf-8"))
    return {f"{c['model']}@{c['window_length']}": c for c in payload["cells"]}


def test_the_grid_writes_a_complete_report(runs: Runs) -> None:
    names = {p.name for p in runs.report_dir.iterdir()}
    assert {"report.md", "results.json", "table1.csv", "efficiency.csv", "window_sweep.csv",
            "case_study.csv", "cells.csv", "ablation.csv"} <= names  # fmt: skip
    for figure in ("efficiency", "window_sweep", "case_study"):
        assert (runs.report_dir / f"{figure}_synthetic.png").read_bytes()[:8] == PNG_MAGIC
    report = (runs.report_dir / "report.md").read_text(encoding="utf-8")
    for heading in ("## Table 1", "## Trust on the test sensor", "## Efficiency",
                    "## Window sweep", "## Case study"):  # fmt: skip
        assert heading in report
    assert "| tesla |" in report and "| epa |" in report
    assert "Cells not yet computed" not in report


def test_cells_hold_scores_costs_and_reasons(runs: Runs) -> None:
    cells = _results(runs)
    assert set(cells) == {"raw@32", "ols@32", "epa@32", "tesla@32", "dlinear@32", "dlinear@16",
                          "dlinear@5000"}  # fmt: skip
    tesla = cells["tesla@32"]
    assert tesla["status"] == "done"
    assert tesla["test"]["n"] > 0 and tesla["epochs_run"] == 1
    assert tesla["train_windows_used"] == 256
    efficiency = tesla["efficiency"]
    assert efficiency["flops"] > efficiency["parameters"] > 0
    assert efficiency["float_bytes"] > 0 and efficiency["int8_bytes"] > 0
    assert efficiency["peak_activation_bytes"] > 0
    assert efficiency["tflm"]["runs"] or efficiency["tflm"]["reason"]
    assert not efficiency["uncounted_ops"]
    assert [trace["label"] for trace in tesla["case"]] == ["low", "mid", "high"]
    trust = tesla["trust"]  # intervals fitted on validation, scored with the GDE on test
    assert 0 < trust["interval_coverage"] <= 1 and trust["interval_mean_width"] > 0
    assert trust["interval_level"] == 0.9
    sweep = cells["dlinear@16"]["efficiency"]
    assert sweep["int8_bytes"] is None and "not measured" in sweep["tflm"]["reason"]
    assert cells["dlinear@5000"]["status"] == "skipped"
    assert "no valid" in cells["dlinear@5000"]["reason"]
    assert cells["epa@32"]["status"] == "done"  # synthetic PM2.5 carries RH


def test_flops_are_counted_from_the_exported_file(runs: Runs) -> None:
    stored = _results(runs)["tesla@32"]["efficiency"]["flops"]
    flatbuffer = next(runs.work_dir.glob("synthetic/*tesla*/model/model.tflite")).read_bytes()
    assert count_flops(resolve_graph(flatbuffer, np.full(32, 20.0, np.float32))) == stored


def test_a_second_invocation_recomputes_nothing(runs: Runs) -> None:
    assert len(runs.first.computed) == 6  # 3 reference rows, 3 trained cells
    assert runs.first.skipped == ["synthetic N=5000 dlinear seed 0"]
    assert runs.second.computed == []
    assert len(runs.second.reused) == 6
    assert runs.cells_after_second == runs.cells_after_first


def test_progress_drives_an_epoch_bar_and_restores_fit() -> None:
    original = keras.Model.fit
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    display = Progress(1, enabled=True)
    with display.training("tiny"):
        assert keras.Model.fit is not original
        model.fit(np.zeros((8, 4)), np.zeros(8), batch_size=4, epochs=2, verbose=0)
    display.finish("tiny done")
    display.close()
    assert keras.Model.fit is original


def test_report_only_rewrites_from_the_cells_and_keeps_the_command(
    runs: Runs, tmp_path: Path
) -> None:
    results = runs.report_dir / "results.json"
    payload = json.loads(results.read_text(encoding="utf-8"))
    payload["command"] = "python -m training bench --epochs 1"
    results.write_text(json.dumps(payload), encoding="utf-8")
    (runs.report_dir / "report.md").unlink()
    config_file = tmp_path / "bench.json"
    config_file.write_text(CONFIG.model_dump_json(), encoding="utf-8")
    code = main(["bench", "--report-dir", str(runs.report_dir), "--config", str(config_file),
                 "--report-only"])  # fmt: skip
    assert code == 0
    report = (runs.report_dir / "report.md").read_text(encoding="utf-8")
    assert "python -m training bench --epochs 1" in report
    assert _cells(runs.report_dir) == runs.cells_after_first

"""Report arithmetic on hand-made numbers: gains, best marks, tables, FLOPs, memory, periods."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from tesla_gateway.contract.manifest import ErrorMetrics
from training.bench.case_study import select_case_periods
from training.bench.cells import CellResult, CellStore, Efficiency, TflmStatus
from training.bench.efficiency import peak_activation_bytes
from training.bench.flops import ResolvedGraph, ResolvedOp, count_flops, uncounted_ops
from training.bench.grid import BenchConfig, DatasetSpec, SweepConfig
from training.bench.report import (
    Column,
    Score,
    gain,
    mark_ranks,
    one_line,
    table1_rows,
    write_report,
)
from training.flatbuffer import Graph, GraphOp


def test_gain_is_the_percent_rmse_reduction() -> None:
    assert gain(8.0, 10.0) == pytest.approx(20.0)
    assert gain(12.0, 10.0) == pytest.approx(-20.0)
    assert gain(None, 10.0) is None
    assert gain(1.0, None) is None
    assert gain(1.0, 0.0) is None


def test_best_and_second_are_the_lowest_and_raw_is_never_marked() -> None:
    marks = mark_ranks({"raw": 1.0, "a": 3.0, "b": 2.0, "c": 2.0, "d": None, "e": 4.0})
    assert marks == {"b": "best", "c": "best", "a": "second"}
    assert mark_ranks({"raw": 1.0, "a": 3.0}, exclude=()) == {"raw": "best", "a": "second"}


def test_reasons_become_one_markdown_line() -> None:
    reason = "no 'GREATER'.\nno 'CAST'.\nno 'GREATER'.\n  a | b  "
    assert one_line(reason) == "no 'GREATER'.; no 'CAST'.; a / b"
    assert len(one_line("x" * 500)) == 240


def test_table1_averages_regions_and_gains() -> None:
    def score(rmse: float) -> Score:
        return Score(rmse=rmse, mae=rmse / 2, n=100, seeds=1, rmse_std=0.0)

    scores = {
        ("a", "raw", 32): score(20.0),
        ("b", "raw", 32): score(10.0),
        ("a", "ols", 32): score(10.0),
        ("b", "ols", 32): score(8.0),
        ("a", "tesla", 32): score(8.0),
        ("b", "tesla", 32): score(6.0),
        ("a", "dlinear", 32): score(12.0),
    }
    columns = [Column("a", "alpha", "pm10"), Column("b", "beta", "pm10")]
    rows = {
        str(r["model"]): r
        for r in table1_rows(scores, columns, ["raw", "ols", "tesla", "dlinear"], 32)
    }
    tesla = rows["tesla"]
    assert tesla["alpha_rmse"] == 8.0
    assert tesla["beta_mae"] == 3.0
    assert tesla["avg_rmse"] == pytest.approx(7.0)
    assert tesla["gain_vs_raw_pct"] == pytest.approx((60.0 + 40.0) / 2)
    assert tesla["gain_vs_ols_pct"] == pytest.approx((20.0 + 25.0) / 2)
    assert rows["dlinear"]["avg_rmse"] is None  # one region missing: no average
    assert rows["dlinear"]["gain_vs_raw_pct"] is None
    assert rows["ols"]["gain_vs_ols_pct"] == pytest.approx(0.0)


def test_flops_charges_per_operator() -> None:
    ops = (
        GraphOp("FULLY_CONNECTED", ((1, 360), (16, 360), (16,)), ((1, 16),), (False, True, True)),
        GraphOp("BATCH_MATMUL", ((1, 4, 9, 4), (1, 4, 4, 9)), ((1, 4, 9, 9),), (False, False)),
        GraphOp(
            "CONV_2D", ((1, 1, 66, 8), (8, 1, 3, 8), (8,)), ((1, 1, 64, 8),), (False, True, True)
        ),
        GraphOp("SOFTMAX", ((1, 4, 9, 9),), ((1, 4, 9, 9),), (False,)),
        GraphOp("MEAN", ((1, 9, 16), (1,)), ((1, 9, 1),), (False, True)),
        GraphOp("RESHAPE", ((1, 16), (2,)), ((16, 1),), (False, True)),
        GraphOp("FOO", ((1, 16),), ((1, 16),), (False,)),
    )
    graph = Graph(ops=ops, input_shape_signature=(-1, 360))
    expected = (2 * 16 * 360 + 16) + (2 * 324 * 4) + (2 * 512 * 24 + 512) + 3 * 324 + 144
    assert count_flops(graph) == expected
    assert uncounted_ops(graph) == ["FOO"]


def test_multiplications_by_constant_zero_weights_are_not_charged() -> None:
    # A 0/1 head-sum matrix [4, 16] with 16 non-zero entries over 81 rows: 2·81·16, not 2·81·64.
    selection = GraphOp(
        "FULLY_CONNECTED", ((81, 16), (4, 16)), ((81, 4),), (False, True), weight_nonzero=16
    )
    dense = GraphOp("FULLY_CONNECTED", ((81, 16), (4, 16)), ((81, 4),), (False, True))
    assert count_flops(Graph(ops=(selection,), input_shape_signature=(-1, 16))) == 2 * 81 * 16
    assert count_flops(Graph(ops=(dense,), input_shape_signature=(-1, 16))) == 2 * 81 * 64


def test_peak_activation_memory_follows_tensor_lifetimes() -> None:
    # t0 input (40 B); op0: t0, w -> t1 (100 B); op1: t1 -> t2 (20 B); op2: t0, t2 -> t3 (8 B).
    graph = ResolvedGraph(
        ops=(
            ResolvedOp("FULLY_CONNECTED", (0, 9), (1,)),
            ResolvedOp("RELU", (1,), (2,)),
            ResolvedOp("ADD", (0, 2), (3,)),
        ),
        shapes={0: (10,), 1: (25,), 2: (5,), 3: (2,), 9: (1000,)},
        itemsizes=dict.fromkeys((0, 1, 2, 3, 9), 4),
        inputs=(0,),
        outputs=(3,),
        constants=frozenset({9}),
    )
    assert peak_activation_bytes(graph) == 40 + 100 + 20  # at op1; the 4,000 B of weights excluded


def test_case_periods_are_the_low_median_and_high_blocks() -> None:
    length, period = 10, 60
    means = [5.0, 1.0, 9.0, 3.0, 7.0, 100.0, 4.0]
    stamps, values = [], []
    for block, mean in enumerate(means):
        present = length if mean != 100.0 else 3  # the extreme block is mostly missing
        for i in range(present):
            stamps.append((block * length + i) * period)
            values.append(mean)
    periods = select_case_periods(np.array(stamps) + 1_000_000, values, period, length)
    starts = {p.label: int(p.timestamps_s[0] - 1_000_000) // (length * period) for p in periods}
    assert starts == {"low": 1, "mid": 6, "high": 2}  # means 1, 4 (nearest the median 4.5), 9
    assert all(len(p.timestamps_s) == length for p in periods)


def _metrics(rmse: float) -> ErrorMetrics:
    return ErrorMetrics(rmse=rmse, mae=rmse * 0.8, n=50)


def _efficiency(flops: int) -> Efficiency:
    return Efficiency(
        parameters=flops // 10,
        flops=flops,
        flops_by_op={"FULLY_CONNECTED": flops},
        peak_activation_bytes=2048,
        weight_bytes=flops,
        float_bytes=4000,
        int8_bytes=2000,
        litert_us_float=10.0,
        litert_us_int8=20.0,
        tflm=TflmStatus(
            runs=flops < 50_000, arena_bytes=9000, reason=None if flops < 50_000 else "too big"
        ),
        export_verified=True,
    )


RMSE = {
    "raw": 30.0,
    "ols": 10.0,
    "tesla": 8.0,
    "dlinear": 9.5,
    "transformer": 10.0,
    "tesla-uniform-local-ffn": 10.5,
    "tesla-local-ffn": 10.2,
    "tesla-ffn-aggregator": 9.0,
    "tesla-uniform-bins": 8.4,
    "tesla-local-only": 8.8,
}


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def synthetic_config(seeds: tuple[int, ...] = (0,)) -> BenchConfig:
    """The hand-made report's grid: one synthetic dataset, TESLA, DLinear and the ablations."""
    return BenchConfig(
        datasets=(DatasetSpec(dataset="synthetic", id="syn", region="nowhere"),),
        models=("tesla", "dlinear"),
        covariates=False,
        epa=False,
        window_length=32,
        sweep=SweepConfig(enabled=False),
        seeds=seeds,
    )


def test_report_from_hand_made_cells(tmp_path: Path) -> None:
    config = synthetic_config()
    store = CellStore(tmp_path)
    spec = config.datasets[0]
    for cell in (*config.reference_cells(spec), *config.cells(spec)):
        learned = cell.seed is not None
        store.save(
            cell,
            CellResult(
                dataset="syn",
                region="nowhere",
                feature="pm10",
                model=cell.model,
                group="paper" if learned else "reference",
                window_length=32,
                seed=cell.seed,
                fingerprint="hand-made",
                status="done",
                test=_metrics(RMSE[cell.model]),
                test_sensor="S3",
                windows={"train": 100, "validation": 50, "test": 50},
                efficiency=_efficiency(100_000 if cell.model == "transformer" else 1000)
                if learned
                else None,
            ),
        )
    report = write_report(config, tmp_path).read_text(encoding="utf-8")

    table1 = {row["model"]: row for row in _csv(tmp_path / "table1.csv")}
    assert float(table1["tesla"]["gain_vs_raw_pct"]) == pytest.approx(100 * (30 - 8) / 30)
    assert float(table1["tesla"]["gain_vs_ols_pct"]) == pytest.approx(20.0)
    assert "| tesla | **8.00** | **6.40** | **8.00** | **6.40** | +73.3 % | +20.0 % |" in report
    assert "| dlinear | *9.50* |" in report
    assert "| raw | 30.00 | 24.00 | 30.00 | 24.00 | - | -200.0 % |" in report
    ablation = {(r["table"], r["model"]): r for r in _csv(tmp_path / "ablation.csv")}
    cumulative = ablation[("cumulative", "tesla")]
    assert float(cumulative["avg_gain_vs_transformer_pct"]) == pytest.approx(20.0)
    assert float(ablation[("cumulative", "tesla-local-ffn")]["avg_gain_vs_transformer_pct"]) == (
        pytest.approx(-2.0)
    )
    change = ablation[("one-at-a-time", "tesla-uniform-bins")]["rmse_change_vs_tesla_pct"]
    assert float(change) == pytest.approx(5.0)
    assert "| transformer | 10.00 | 10,000 | 100,000 |" in report
    assert "no [1]" in report and "[1] too big" in report
    results = json.loads((tmp_path / "results.json").read_text())
    assert {c["model"] for c in results["cells"]} == set(RMSE)
    assert (tmp_path / "efficiency_syn.png").stat().st_size > 0

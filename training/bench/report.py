"""The report directory: ``report.md``, CSV tables, PNG plots and ``results.json``.

Tables (lower is better everywhere; µg/m³ unless stated):

* **Table 1** (the paper's Table 1): test RMSE and MAE per region × feature × model, the
  average over regions, the gain over raw and over OLS (percent RMSE reduction, per region, then
  averaged as the paper averages its gains). Best **bold**, second *italic*, among every row but
  raw.
* **Table 2** (ablation): the paper's cumulative path from the vanilla Transformer to TESLA with
  the average RMSE gain over the Transformer, and each of TESLA's changes removed on its own.
* **Efficiency** (Figure 5), **window sweep** (Figure 6) and the **case study** (Figure 7).

With several seeds a cell's score is the mean over seeds, shown with its range [min–max] and
the number of seeds; :mod:`training.bench.reproduction` writes what reproduces from those ranges.
"""

from __future__ import annotations

import csv
import json
import math
import platform
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.bench.cells import CaseTrace, CellResult, CellStore
from training.bench.efficiency import METHODS
from training.bench.grid import (
    ABLATION_CHAIN,
    MODELS,
    PAPER_MODELS,
    REFERENCE_MODELS,
    BenchConfig,
    DatasetSpec,
)
from training.bench.reproduction import Spread, reproduction_lines

__all__ = [
    "Score",
    "collect",
    "gain",
    "mark_ranks",
    "one_line",
    "table1_rows",
    "write_report",
]

Marks = dict[str, str]  # row -> "best" | "second"
ONE_AT_A_TIME = ("tesla", "tesla-uniform-bins", "tesla-local-only", "tesla-ffn-aggregator")


@dataclass(frozen=True)
class Score:
    """A model's test score on one dataset at one N, averaged over seeds."""

    rmse: float
    mae: float
    n: int
    seeds: int
    rmse_std: float
    rmse_min: float = math.nan
    rmse_max: float = math.nan

    @property
    def spread(self) -> Spread:
        low = self.rmse if math.isnan(self.rmse_min) else self.rmse_min
        high = self.rmse if math.isnan(self.rmse_max) else self.rmse_max
        return Spread(self.rmse, low, high, self.seeds)


@dataclass(frozen=True)
class Column:
    """One (region, feature) of the grid: the dataset it comes from."""

    dataset: str
    region: str
    feature: str


def gain(value: float | None, baseline: float | None) -> float | None:
    """Percent reduction of ``value`` relative to ``baseline`` (positive: better than it)."""
    if value is None or baseline is None or baseline == 0:
        return None
    return 100.0 * (baseline - value) / baseline


def mark_ranks(values: dict[str, float | None], *, exclude: Iterable[str] = ("raw",)) -> Marks:
    """Best and second-best (lowest) rows; ties share the mark; ``exclude`` is never marked."""
    skip = set(exclude)
    distinct = sorted({v for k, v in values.items() if v is not None and k not in skip})
    marks: Marks = {}
    for row, value in values.items():
        if value is None or row in skip:
            continue
        if value == distinct[0]:
            marks[row] = "best"
        elif len(distinct) > 1 and value == distinct[1]:
            marks[row] = "second"
    return marks


def _mean(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present and len(present) == len(values) else None


def collect(results: Iterable[CellResult]) -> dict[tuple[str, str, int], Score]:
    """Scores by (dataset, model, N), averaged over seeds; skipped cells are left out."""
    groups: dict[tuple[str, str, int], list[CellResult]] = {}
    for result in results:
        if result.status == "done" and result.test is not None:
            groups.setdefault((result.dataset, result.model, result.window_length), []).append(
                result
            )
    scores = {}
    for key, members in groups.items():
        rmse = [m.test.rmse for m in members if m.test]
        scores[key] = Score(
            rmse=float(np.mean(rmse)),
            mae=float(np.mean([m.test.mae for m in members if m.test])),
            n=int(members[0].test.n) if members[0].test else 0,
            seeds=len(members),
            rmse_std=float(np.std(rmse)),
            rmse_min=float(np.min(rmse)),
            rmse_max=float(np.max(rmse)),
        )
    return scores


def table1_rows(
    scores: dict[tuple[str, str, int], Score],
    columns: Sequence[Column],
    models: Sequence[str],
    window_length: int,
) -> list[dict[str, object]]:
    """Table 1 for one feature: per model, RMSE/MAE per column, averages and gains."""
    rows: list[dict[str, object]] = []
    for model in models:
        row: dict[str, object] = {"model": model}
        gains_raw, gains_ols, rmses, maes = [], [], [], []
        for column in columns:
            score = scores.get((column.dataset, model, window_length))
            raw = scores.get((column.dataset, "raw", window_length))
            ols = scores.get((column.dataset, "ols", window_length))
            rmse = score.rmse if score else None
            row[f"{column.region}_rmse"] = rmse
            row[f"{column.region}_mae"] = score.mae if score else None
            rmses.append(rmse)
            maes.append(score.mae if score else None)
            gains_raw.append(gain(rmse, raw.rmse if raw else None))
            gains_ols.append(gain(rmse, ols.rmse if ols else None))
        row["avg_rmse"] = _mean(rmses)
        row["avg_mae"] = _mean(maes)
        row["gain_vs_raw_pct"] = _mean(gains_raw)
        row["gain_vs_ols_pct"] = _mean(gains_ols)
        rows.append(row)
    return rows


def _range_text(row: dict[str, object], key: str) -> str:
    """`` [low–high]`` after an RMSE averaged over two or more seeds, ``†`` if a seed diverged."""
    if not key.endswith("_rmse") or key == "avg_rmse":
        return ""
    region = key.removesuffix("_rmse")
    seeds, low, high = (
        row.get(f"{region}_seeds"),
        row.get(f"{region}_rmse_min"),
        row.get(f"{region}_rmse_max"),
    )
    dagger = " †" if row.get(f"{region}_diverged") else ""
    if not isinstance(seeds, int) or seeds < 2 or low is None or high is None:
        return dagger
    return f" [{_fmt(low)}–{_fmt(high)}]{dagger}"


def _fmt(value: object, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _marked(value: object, mark: str | None, digits: int = 2) -> str:
    text = _fmt(value, digits)
    if mark == "best":
        return f"**{text}**"
    if mark == "second":
        return f"*{text}*"
    return text


def _trust_cells(row: dict[str, object]) -> list[str]:
    meets = row["meets_indicative_dqo"]
    return [
        str(row["region"]),
        str(row["feature"]),
        str(row["model"]),
        _percent(row["interval_coverage"]),
        _fmt(row["interval_mean_width"]),
        _percent(row["gde_expanded_relative_uncertainty"]),
        _fmt(row["gde_limit_value"], 0),
        "-" if meets is None else ("meets" if meets else "misses"),
        _fmt(row["gde_slope"], 3),
        _fmt(row["gde_intercept"]),
        _fmt(row["gde_r2"], 3),
        _fmt(row["gde_days"], 0),
    ]


def _percent(value: object) -> str:
    return f"{value:.1%}" if isinstance(value, float) else "-"


def _signed(value: float | None) -> str:
    return "n/a" if value is None else f"{value:+.1f} %"


def _md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def _write_csv(path: Path, rows: Sequence[dict[str, object]]) -> None:
    fields: list[str] = []
    for row in rows:
        fields += [key for key in row if key not in fields]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else v) for k, v in row.items()})


def one_line(text: object, limit: int = 240) -> str:
    """A reason as one markdown-safe line: repeated lines dropped, whitespace collapsed."""
    lines = [" ".join(line.split()) for line in str(text).splitlines()]
    joined = "; ".join(dict.fromkeys(line for line in lines if line)).replace("|", "/")
    return joined if len(joined) <= limit else joined[: limit - 1] + "…"


def _kib(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 1024:,.1f} KiB"


def _case_scores(trace: CaseTrace) -> tuple[float | None, float | None]:
    pairs = [
        (v, r)
        for v, r in zip(trace.values, trace.reference, strict=True)
        if v is not None and r is not None
    ]
    if not pairs:
        return None, None
    error = np.array([v - r for v, r in pairs])
    return float(np.sqrt(np.mean(error**2))), float(np.mean(np.abs(error)))


class _Report:
    """Builds every table from the stored cells of one configuration."""

    def __init__(self, config: BenchConfig, report_dir: Path) -> None:
        self.config = config
        self.dir = report_dir
        store = CellStore(report_dir)
        self.results: list[CellResult] = []
        self.missing: list[str] = []
        self.columns: list[Column] = []
        for spec in config.datasets:
            found = self._load(store, spec)
            raw = next((r for r in found if r.model == "raw"), None)
            if raw is None:
                continue
            if config.features is not None and raw.feature not in config.features:
                continue
            self.results += found
            self.columns.append(Column(spec.key, raw.region, raw.feature))
        self.scores = collect(self.results)
        self.n = config.window_length

    def _load(self, store: CellStore, spec: DatasetSpec) -> list[CellResult]:
        found = []
        for cell in (*self.config.reference_cells(spec), *self.config.cells(spec)):
            result = store.load(cell)
            if result is None:
                self.missing.append(cell.label)
            else:
                found.append(result)
        return found

    @property
    def features(self) -> list[str]:
        return list(dict.fromkeys(column.feature for column in self.columns))

    def columns_of(self, feature: str) -> list[Column]:
        return [column for column in self.columns if column.feature == feature]

    def cell(self, dataset: str, model: str, n: int) -> CellResult | None:
        done = [
            r for r in self.results if (r.dataset, r.model, r.window_length) == (dataset, model, n)
        ]
        return sorted(done, key=lambda r: (r.status != "done", r.seed or 0))[0] if done else None

    # Table 1 ---------------------------------------------------------------------------------
    def table1_models(self) -> list[str]:
        learned = [m for m in self.config.grid_models if MODELS[m].group != "ablation"]
        return [*[c.model for c in self.config.reference_cells(self.config.datasets[0])], *learned]

    def table1(self) -> tuple[list[str], list[dict[str, object]]]:
        lines: list[str] = []
        every: list[dict[str, object]] = []
        for feature in self.features:
            columns = self.columns_of(feature)
            rows = table1_rows(self.scores, columns, self.table1_models(), self.n)
            rows = [r for r in rows if any(r[f"{c.region}_rmse"] is not None for c in columns)]
            keys = [f"{c.region}_{m}" for c in columns for m in ("rmse", "mae")]
            keys += ["avg_rmse", "avg_mae"]
            marks = {k: mark_ranks({str(r["model"]): r[k] for r in rows}) for k in keys}  # type: ignore[misc]
            header = ["model"]
            header += [f"{c.region} {m}" for c in columns for m in ("RMSE", "MAE")]
            header += ["avg RMSE", "avg MAE", "gain vs raw", "gain vs OLS"]
            body = []
            for row in rows:
                model = str(row["model"])
                for column in columns:
                    score = self.scores.get((column.dataset, model, self.n))
                    row[f"{column.region}_rmse_min"] = score.rmse_min if score else None
                    row[f"{column.region}_rmse_max"] = score.rmse_max if score else None
                    row[f"{column.region}_seeds"] = score.seeds if score else 0
                    row[f"{column.region}_diverged"] = self.diverged_seeds(column.dataset, model)
                body.append(
                    [
                        model,
                        *[_marked(row[k], marks[k].get(model)) + _range_text(row, k) for k in keys],
                        "-" if model == "raw" else _signed(row["gain_vs_raw_pct"]),  # type: ignore[arg-type]
                        "-" if model == "ols" else _signed(row["gain_vs_ols_pct"]),  # type: ignore[arg-type]
                    ]
                )
                every.append({"feature": feature, **row})
            lines += [f"### {feature.upper().replace('_', '.')} (N = {self.n})", ""]
            lines += _md_table(header, body)
            if any(row.get(f"{c.region}_diverged") for row in rows for c in columns):
                lines += [
                    '† a seed of this cell diverged (listed under "Runs that diverged"); the '
                    "value is over the seeds that finished.",
                    "",
                ]
        return lines, every

    def diverged_seeds(self, dataset: str, model: str) -> int:
        return sum(
            1
            for r in self.results
            if (r.dataset, r.model, r.window_length, r.status)
            == (dataset, model, self.n, "diverged")
        )

    # What reproduces -------------------------------------------------------------------------
    def reproduction(self) -> list[str]:
        def spread(label: str, model: str) -> Spread | None:
            column = next(c for c in self.columns if f"{c.region} {c.feature}" == label)
            score = self.scores.get((column.dataset, model, self.n))
            if score is None:
                return None
            if model in REFERENCE_MODELS:  # deterministic: a point, not a seed range
                return Spread(score.rmse, score.rmse, score.rmse, 0)
            return score.spread

        return reproduction_lines(
            [f"{c.region} {c.feature}" for c in self.columns],
            spread,
            PAPER_MODELS,
            [m for m, *_ in ABLATION_CHAIN] if self.config.ablations else [],
            ONE_AT_A_TIME if self.config.ablations else (),
        )

    # Trust -----------------------------------------------------------------------------------
    def trust_rows(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for column in self.columns:
            for model in self.table1_models():
                result = self.cell(column.dataset, model, self.n)
                if result is None or result.trust is None:
                    continue
                rows.append(
                    {"region": column.region, "feature": column.feature, "model": model,
                     "seed": result.seed, **result.trust.model_dump()}
                )  # fmt: skip
        return rows

    def trust(self) -> tuple[list[str], list[dict[str, object]]]:
        rows = self.trust_rows()
        if not rows:
            return [], []
        header = [
            *("region", "feature", "model", "interval coverage", "mean width", "W at LV"),
            *("LV", "indicative DQO (50 %)", "slope", "intercept", "R²", "days"),
        ]
        body = [_trust_cells(row) for row in rows]
        return _md_table(header, body), rows

    # Table 2 ---------------------------------------------------------------------------------
    def ablation(self) -> tuple[list[str], list[dict[str, object]]]:
        columns = self.columns
        if not self.config.ablations or not columns:
            return [], []
        names = [f"{c.region} {c.feature}" for c in columns]

        def rmse(model: str, column: Column) -> float | None:
            score = self.scores.get((column.dataset, model, self.n))
            return score.rmse if score else None

        lines = [
            "Cumulative, as the paper's Table 2 (gain: mean RMSE reduction vs Transformer):",
            "",
        ]
        rows: list[dict[str, object]] = []
        body = []
        chain_values = {m: [rmse(m, c) for c in columns] for m, *_ in ABLATION_CHAIN}
        column_marks = [
            mark_ranks({m: v[i] for m, v in chain_values.items()}, exclude=())
            for i in range(len(columns))
        ]
        for model, token, embedding, aggregator in ABLATION_CHAIN:
            values = chain_values[model]
            gains = [gain(v, t) for v, t in zip(values, chain_values["transformer"], strict=True)]
            average = None if model == "transformer" else _mean(gains)
            body.append(
                [model, token, embedding, aggregator]
                + [_marked(v, column_marks[i].get(model)) for i, v in enumerate(values)]
                + ["-" if model == "transformer" else _signed(average)]
            )
            rows.append(
                {
                    "table": "cumulative",
                    "model": model,
                    "token": token,
                    "embedding": embedding,
                    "aggregator": aggregator,
                    **{f"{n}_rmse": v for n, v in zip(names, values, strict=True)},
                    "avg_gain_vs_transformer_pct": average,
                }
            )
        lines += _md_table(
            ["model", "token", "embedding", "aggregator", *[f"{n} RMSE" for n in names],
             "avg gain"],
            body,
        )  # fmt: skip
        lines += ["One change at a time (RMSE change vs full TESLA; + means worse):", ""]
        body = []
        tesla = [rmse("tesla", c) for c in columns]
        for model in ONE_AT_A_TIME:
            values = [rmse(model, c) for c in columns]
            delta = [
                None if v is None or t is None else 100.0 * (v - t) / t
                for v, t in zip(values, tesla, strict=True)
            ]
            change = _mean(delta)
            body.append(
                [model, MODELS[model].description, *[_fmt(v) for v in values],
                 "-" if model == "tesla" else _signed(change)]
            )  # fmt: skip
            rows.append(
                {
                    "table": "one-at-a-time",
                    "model": model,
                    **{f"{n}_rmse": v for n, v in zip(names, values, strict=True)},
                    "rmse_change_vs_tesla_pct": change,
                }
            )
        lines += _md_table(["model", "change", *[f"{n} RMSE" for n in names], "vs TESLA"], body)
        return lines, rows

    # Efficiency ------------------------------------------------------------------------------
    def efficiency_rows(self, column: Column) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for model in self.config.grid_models:
            result = self.cell(column.dataset, model, self.n)
            if result is None or result.efficiency is None:
                continue
            e = result.efficiency
            score = self.scores.get((column.dataset, model, self.n))
            rows.append(
                {
                    "dataset": column.dataset,
                    "model": model,
                    "rmse": score.rmse if score else None,
                    "parameters": e.parameters,
                    "flops": e.flops,
                    "int8_graph_flops": e.int8_flops,
                    "peak_activation_bytes": e.peak_activation_bytes,
                    "weight_bytes": e.weight_bytes,
                    "float_tflite_bytes": e.float_bytes,
                    "int8_tflite_bytes": e.int8_bytes,
                    "litert_us_float": e.litert_us_float,
                    "litert_us_int8": e.litert_us_int8,
                    "tflm_runs": e.tflm.runs,
                    "tflm_arena_bytes": e.tflm.arena_bytes,
                    "tflm_reason": e.tflm.reason,
                    "export_verified": e.export_verified,
                    "export_reason": e.export_reason,
                    "int8_rmse_check_windows": e.integer_rmse_vs_reference,
                    "float_rmse_check_windows": e.float_rmse_vs_reference,
                    "uncounted_ops": ",".join(e.uncounted_ops),
                }
            )
        return rows

    def efficiency(self) -> tuple[list[str], list[dict[str, object]]]:
        lines: list[str] = []
        every: list[dict[str, object]] = []
        notes: dict[str, int] = {}
        for column in self.columns:
            rows = self.efficiency_rows(column)
            body = []
            for row in rows:
                if row["tflm_runs"]:
                    tflm = f"yes, {_kib(row['tflm_arena_bytes'])}"  # type: ignore[arg-type]
                else:
                    reason = one_line(row["tflm_reason"])
                    note = notes.setdefault(reason, len(notes) + 1)
                    tflm = f"no [{note}]"
                body.append(
                    [
                        str(row["model"]),
                        _fmt(row["rmse"]),
                        _fmt(row["parameters"]),
                        _fmt(row["flops"]),
                        _kib(row["peak_activation_bytes"]),  # type: ignore[arg-type]
                        _kib(row["float_tflite_bytes"]),  # type: ignore[arg-type]
                        _kib(row["int8_tflite_bytes"]),  # type: ignore[arg-type]
                        _fmt(row["litert_us_float"], 1),
                        _fmt(row["litert_us_int8"], 1),
                        tflm,
                    ]
                )
            lines += [f"### {column.region} {column.feature} (N = {self.n})", ""]
            lines += _md_table(
                ["model", "RMSE", "params", "FLOPs", "peak act. mem (float)", "model.tflite",
                 "model_int8.tflite", "LiteRT float µs", "LiteRT int8 µs", "TFLite Micro"],
                body,
            )  # fmt: skip
            every += rows
        if notes:
            lines += [f"[{n}] {reason}" + "  " for reason, n in notes.items()] + [""]
        failed = [
            (str(r["model"]), one_line(r["export_reason"]))
            for r in every
            if not r["export_verified"] and r["export_reason"]
        ]
        if failed:
            lines += ["Export verification did not pass for:", ""]
            lines += [f"- `{m}`: {reason}" for m, reason in dict(failed).items()] + [""]
        return lines, every

    # Window sweep ----------------------------------------------------------------------------
    def sweep_rows(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        for column in self.columns:
            for model in self.config.sweep.models:
                for n in self.config.sweep_windows:
                    result = self.cell(column.dataset, model, n)
                    score = self.scores.get((column.dataset, model, n))
                    rows.append(
                        {
                            "dataset": column.dataset,
                            "region": column.region,
                            "feature": column.feature,
                            "model": model,
                            "window_length": n,
                            "rmse": score.rmse if score else None,
                            "mae": score.mae if score else None,
                            "flops": result.efficiency.flops
                            if result and result.efficiency
                            else None,
                            "parameters": result.efficiency.parameters
                            if result and result.efficiency
                            else None,
                            "status": "missing" if result is None else result.status,
                            "reason": result.reason if result else None,
                        }
                    )
        return rows

    def sweep(self) -> tuple[list[str], list[dict[str, object]]]:
        rows = self.sweep_rows()
        if not rows:
            return [], []
        lines: list[str] = []
        windows = self.config.sweep_windows
        for column in self.columns:
            body = []
            for model in self.config.sweep.models:
                cells = {
                    int(r["window_length"]): r  # type: ignore[call-overload]
                    for r in rows
                    if r["dataset"] == column.dataset and r["model"] == model
                }
                body.append(
                    [model]
                    + [
                        "n/a"
                        if cells[n]["rmse"] is None
                        else f"{_fmt(cells[n]['rmse'])} / {_fmt(cells[n]['flops'])}"
                        for n in windows
                    ]
                )
            lines += [
                f"### {column.region} {column.feature}: test RMSE / FLOPs per calibration",
                "",
            ]
            lines += _md_table(["model", *[f"N = {n}" for n in windows]], body)
        odd = [r for r in rows if r["status"] != "done"]
        if odd:
            lines += ["Not available:", ""]
            lines += [
                f"- {r['model']} N = {r['window_length']}: {r['status']} "
                + one_line(r["reason"] or "")
                for r in odd
            ] + [""]
        return lines, rows

    # Case study ------------------------------------------------------------------------------
    def case_rows(self) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = []
        models = ["raw", "ols", "epa", *self.config.case_study_models]
        for column in self.columns:
            for model in models:
                result = self.cell(column.dataset, model, self.n)
                if result is None or not result.case:
                    continue
                for trace in result.case:
                    rmse, mae = _case_scores(trace)
                    present = [r for r in trace.reference if r is not None]
                    rows.append(
                        {
                            "dataset": column.dataset,
                            "model": model,
                            "period": trace.label,
                            "start_utc": _utc(trace.timestamps_s[0]),
                            "mean_reference": float(np.mean(present)) if present else None,
                            "rmse": rmse,
                            "mae": mae,
                        }
                    )
        return rows

    def case_study(self) -> tuple[list[str], list[dict[str, object]]]:
        rows = self.case_rows()
        lines: list[str] = []
        for column in self.columns:
            mine = [r for r in rows if r["dataset"] == column.dataset]
            if not mine:
                continue
            periods = list(dict.fromkeys(str(r["period"]) for r in mine))
            lines += [f"### {column.region} {column.feature}, test sensor", ""]
            described = []
            for period in periods:
                first = next(r for r in mine if r["period"] == period)
                described.append(
                    f"{period}: from {first['start_utc']}, mean reference "
                    f"{_fmt(first['mean_reference'], 1)}"
                )
            lines += ["Periods — " + "; ".join(described) + ".", ""]
            body = []
            models = list(dict.fromkeys(str(r["model"]) for r in mine))
            for model in models:
                cells = {str(r["period"]): r for r in mine if r["model"] == model}
                body.append(
                    [model]
                    + [
                        f"{_fmt(cells[p]['rmse'])} / {_fmt(cells[p]['mae'])}"
                        if p in cells
                        else "n/a"
                        for p in periods
                    ]
                )
            lines += _md_table(["model", *[f"{p} RMSE / MAE" for p in periods]], body)
        return lines, rows


def _utc(seconds: int) -> str:
    return np.datetime_as_string(np.datetime64(int(seconds), "s"), unit="m") + "Z"


def _environment() -> dict[str, str]:
    import keras
    import tensorflow as tf

    return {
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
        "machine": platform.machine(),
        "processor_count": str(__import__("os").cpu_count()),
    }


def write_report(config: BenchConfig, report_dir: Path, *, command: str | None = None) -> Path:
    """Write report.md, the CSVs, the PNGs and results.json from the stored cells."""
    from training.bench import plots

    report = _Report(config, report_dir)
    table1_lines, table1 = report.table1()
    ablation_lines, ablation = report.ablation()
    efficiency_lines, efficiency = report.efficiency()
    sweep_lines, sweep = report.sweep()
    case_lines, case = report.case_study()
    trust_lines, trust = report.trust()
    figures = plots.draw_all(report_dir, report.results, config, efficiency, sweep)

    lines = ["# Calibration benchmark (the paper's comparison, reproduced)", ""]
    if command:
        lines += ["```sh", command, "```", ""]
    lines += _budget_lines(config, report)
    lines += ["## Table 1 — accuracy on the test sensor", ""]
    lines += [
        "Test RMSE / MAE in µg/m³ (mean over seeds; after an RMSE of two or more seeds its "
        "[min–max] over them, the number of seeds per cell in table1.csv). **Bold** best, "
        "*italic* second (raw not ranked). Gains are the RMSE reduction over raw and over OLS "
        "on the current reading. "
        "`linear` is the paper's LTSF-Linear baseline, `ols` the practitioners' linear "
        "calibration.",
        "",
    ]
    lines += table1_lines
    skipped = [r for r in report.results if r.status == "skipped"]
    if skipped:
        lines += ["Rows not computed:", ""]
        reasons = (
            f"- `{r.model}` N = {r.window_length} ({r.dataset}): {one_line(r.reason)}"
            for r in skipped
        )
        lines += [*dict.fromkeys(reasons), ""]  # once per dataset, not once per seed
    diverged = [r for r in report.results if r.status == "diverged"]
    if diverged:
        lines += [
            "Runs that diverged (left out of every mean and range above, which are over the "
            "seeds that finished; a model's count of seeds per cell is in table1.csv):",
            "",
        ]
        lines += [
            f"- `{r.model}` N = {r.window_length} ({r.dataset}), seed {r.seed}: "
            f"{one_line(r.reason)}"
            for r in sorted(diverged, key=lambda r: (r.dataset, r.model, r.seed or 0))
        ] + [""]
    if ablation_lines:
        lines += [f"## Table 2 — ablation (N = {config.window_length}, test RMSE)", ""]
        lines += ablation_lines
    lines += ["## What reproduces and what does not", ""]
    lines += [
        "Written from the stored cells (training/bench/reproduction.py): a difference counts "
        "only when the two cells' RMSE ranges over seeds do not overlap; with one seed nothing "
        "is separated. Cells still missing are listed at the end.",
        "",
    ]
    lines += report.reproduction()
    if trust_lines:
        lines += ["## Trust on the test sensor", ""]
        lines += [
            "90 % split conformal intervals fitted on the validation sensor (concentration "
            "bins, training/conformal.py): their coverage and mean width on the test sensor. "
            "W: expanded relative uncertainty at the limit value LV as in the EU Guide to the "
            "Demonstration of Equivalence (orthogonal regression between the test sensor's "
            "daily means and the reference, u(reference) = 0; training/equivalence.py), "
            "against the 50 % data quality objective of Directive 2008/50/EC for indicative "
            "measurements. First seed of each cell.",
            "",
        ]
        lines += trust_lines
    lines += ["## Efficiency (Figure 5)", "", "Per calibration, batch 1, this machine.", ""]
    lines += efficiency_lines
    lines += ["Methods:", ""] + [f"- **{k}**: {v}" for k, v in METHODS.items()] + [""]
    if sweep_lines:
        lines += ["## Window sweep (Figure 6)", ""]
        lines += [
            "Each N trains on its own windows (a window needs N valid readings), so the test "
            "windows differ slightly between N.",
            "",
        ]
        lines += sweep_lines
    if case_lines:
        lines += ["## Case study (Figure 7)", "", *case_lines]
    if figures:
        lines += ["## Figures", ""] + [f"![{f.stem}]({f.name})" for f in figures] + [""]
    if report.missing:
        lines += ["## Cells not yet computed", ""] + [f"- {m}" for m in report.missing] + [""]

    path = report_dir / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    _write_csv(report_dir / "table1.csv", table1)
    _write_csv(report_dir / "ablation.csv", ablation)
    _write_csv(report_dir / "efficiency.csv", efficiency)
    _write_csv(report_dir / "window_sweep.csv", sweep)
    _write_csv(report_dir / "case_study.csv", case)
    _write_csv(report_dir / "trust.csv", trust)
    _write_csv(report_dir / "cells.csv", [_cell_row(r) for r in report.results])
    payload = {
        "command": command,
        "config": config.model_dump(mode="json"),
        "environment": _environment(),
        "methods": METHODS,
        "tables": {
            "table1": table1,
            "ablation": ablation,
            "efficiency": efficiency,
            "window_sweep": sweep,
            "case_study": case,
            "trust": trust,
        },
        "cells": [r.model_dump(mode="json") for r in report.results],
        "missing_cells": report.missing,
    }
    (report_dir / "results.json").write_text(
        json.dumps(payload, indent=1, sort_keys=True) + "\n", encoding="utf-8"
    )
    return path


def _cell_row(result: CellResult) -> dict[str, object]:
    e = result.efficiency
    return {
        "dataset": result.dataset,
        "region": result.region,
        "feature": result.feature,
        "model": result.model,
        "window_length": result.window_length,
        "seed": result.seed,
        "status": result.status,
        "reason": result.reason,
        "test_rmse": result.test.rmse if result.test else None,
        "test_mae": result.test.mae if result.test else None,
        "test_n": result.test.n if result.test else None,
        "validation_rmse": result.validation.rmse if result.validation else None,
        "raw_rmse_same_windows": result.test_raw.rmse if result.test_raw else None,
        "ols_rmse_same_windows": result.test_ols.rmse if result.test_ols else None,
        "epochs_run": result.epochs_run,
        "train_windows_used": result.train_windows_used,
        "flops": e.flops if e else None,
        "parameters": e.parameters if e else None,
        "seconds_total": round(sum(result.seconds.values()), 1),
    }


def _budget_lines(config: BenchConfig, report: _Report) -> list[str]:
    lines = ["## Budget and data", ""]
    cap = "all" if config.max_train_windows is None else f"{config.max_train_windows:,}"
    lines += [
        f"- Protocol: batch {config.batch_size}, Adam at {config.learning_rate:g}, MSE, "
        f"{config.epochs} epoch(s) with early stopping (patience "
        f"{config.early_stopping_patience}), seeds {', '.join(map(str, config.seeds))}; "
        f"training windows per run: {cap}; main N = {config.window_length}.",
        f"- Models: {', '.join(config.grid_models)}; reference rows: "
        f"{', '.join(c.model for c in config.reference_cells(config.datasets[0]))}.",
    ]
    if config.sweep.enabled:
        lines.append(
            f"- Window sweep: N ∈ {{{', '.join(map(str, config.sweep.windows))}}} for "
            f"{', '.join(config.sweep.models)} ({config.sweep.measure} export off the main N)."
        )
    for column in report.columns:
        raw = report.cell(column.dataset, "raw", config.window_length)
        if raw is None:
            continue
        windows = ", ".join(f"{k} {v:,}" for k, v in raw.windows.items())
        lines.append(
            f"- `{column.dataset}` ({column.region}, {column.feature}): test sensor "
            f"{raw.test_sensor}; windows at N = {config.window_length}: {windows}."
        )
    return [*lines, ""]

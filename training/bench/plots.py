"""PNG figures of a benchmark (matplotlib, Agg; no display needed).

* ``efficiency_<dataset>.png`` (paper Figure 5): test RMSE against peak activation memory, and
  against FLOPs per calibration with the circle area proportional to the parameter count.
* ``window_sweep_<dataset>.png`` (Figure 6): RMSE and FLOPs against the window length N.
* ``case_study_<dataset>.png`` (Figure 7): raw, reference and calibrated traces of the test
  sensor over a low, a mid and a high concentration period.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from training.bench.cells import CellResult
from training.bench.grid import MODELS, BenchConfig

__all__ = ["case_study", "draw_all", "efficiency", "window_sweep"]

_DPI = 90
_HIGHLIGHT = "#c0392b"  # TESLA
_PALETTE = ("#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#e377c2", "#bcbd22")


def _colour(model: str, index: int) -> str:
    return _HIGHLIGHT if model == "tesla" else _PALETTE[index % len(_PALETTE)]


def efficiency(path: Path, rows: Sequence[dict[str, object]], title: str) -> Path | None:
    """RMSE vs memory and vs FLOPs (circle area ∝ parameters) for the non-ablation models."""
    shown = [
        r
        for r in rows
        if r["rmse"] is not None and MODELS[str(r["model"])].group in ("paper", "covariate")
    ]
    if not shown:
        return None
    figure = Figure(figsize=(11, 4.4), dpi=_DPI)
    memory_axes, flops_axes = figure.subplots(1, 2)
    largest = max(float(r["parameters"]) for r in shown)  # type: ignore[arg-type]
    for index, row in enumerate(shown):
        model = str(row["model"])
        colour = _colour(model, index)
        rmse = float(row["rmse"])  # type: ignore[arg-type]
        memory = float(row["peak_activation_bytes"]) / 1024  # type: ignore[arg-type]
        flops = float(row["flops"])  # type: ignore[arg-type]
        size = 40 + 900 * float(row["parameters"]) / largest  # type: ignore[arg-type]
        memory_axes.scatter(memory, rmse, s=60, color=colour, zorder=3)
        offset = (5, 4) if index % 2 == 0 else (5, -11)  # alternate: neighbours overlap less
        memory_axes.annotate(model, (memory, rmse), xytext=offset, textcoords="offset points",
                             fontsize=8)  # fmt: skip
        flops_axes.scatter(flops, rmse, s=size, color=colour, alpha=0.55, edgecolors="k",
                           linewidths=0.5, zorder=3)  # fmt: skip
        radius = float(np.sqrt(size)) / 2  # marker size is an area in points²: label beside it
        flops_axes.annotate(model, (flops, rmse), xytext=(radius + 2, offset[1]),
                            textcoords="offset points", fontsize=8)  # fmt: skip
    memory_axes.set_xscale("log")
    memory_axes.set_xlabel("peak activation memory, float graph (KiB, log)")
    memory_axes.set_ylabel("test RMSE (µg/m³)")
    memory_axes.set_title("(a) accuracy vs memory")
    flops_axes.set_xscale("log")
    flops_axes.set_xlabel("FLOPs per calibration (log)")
    flops_axes.set_ylabel("test RMSE (µg/m³)")
    flops_axes.set_title("(b) accuracy vs FLOPs (area ∝ parameters)")
    for axes in (memory_axes, flops_axes):
        axes.grid(True, which="both", alpha=0.3)
        axes.margins(x=0.12, y=0.1)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path)
    return path


def window_sweep(path: Path, rows: Sequence[dict[str, object]], title: str) -> Path | None:
    """RMSE and FLOPs against N, one line per model (missing N left out)."""
    models = list(dict.fromkeys(str(r["model"]) for r in rows))
    if not any(r["rmse"] is not None for r in rows):
        return None
    figure = Figure(figsize=(11, 4.2), dpi=_DPI)
    rmse_axes, flops_axes = figure.subplots(1, 2)
    for index, model in enumerate(models):
        mine = sorted(
            (r for r in rows if r["model"] == model and r["rmse"] is not None),
            key=lambda r: int(r["window_length"]),  # type: ignore[call-overload]
        )
        if not mine:
            continue
        n = [int(r["window_length"]) for r in mine]  # type: ignore[call-overload]
        colour = _colour(model, index)
        rmse_axes.plot(n, [float(r["rmse"]) for r in mine], "o-", color=colour, label=model)  # type: ignore[arg-type]
        with_flops = [r for r in mine if r["flops"] is not None]
        flops_axes.plot(
            [int(r["window_length"]) for r in with_flops],  # type: ignore[call-overload]
            [float(r["flops"]) for r in with_flops],  # type: ignore[arg-type]
            "o-",
            color=colour,
            label=model,
        )
    ticks = sorted({int(r["window_length"]) for r in rows})  # type: ignore[call-overload]
    for axes in (rmse_axes, flops_axes):
        axes.set_xscale("log")
        axes.set_xticks(ticks, [str(t) for t in ticks])
        axes.minorticks_off()
        axes.set_xlabel("window length N (periods, log)")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
    rmse_axes.set_ylabel("test RMSE (µg/m³)")
    rmse_axes.set_title("(a) accuracy vs N")
    flops_axes.set_yscale("log")
    flops_axes.set_ylabel("FLOPs per calibration (log)")
    flops_axes.set_title("(b) cost vs N")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path)
    return path


def _times(stamps: Sequence[int]) -> list[datetime]:
    return [datetime.fromtimestamp(int(t), tz=UTC) for t in stamps]


def _series(values: Sequence[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def case_study(
    path: Path, results: Sequence[CellResult], models: Sequence[str], title: str
) -> Path | None:
    """Traces of raw, reference, OLS and the case-study models, one panel per period."""
    by_model = {r.model: r for r in results if r.case}
    raw = by_model.get("raw")
    if raw is None:
        return None
    labels = [trace.label for trace in raw.case]
    figure = Figure(figsize=(12, 3.0 * len(labels) + 0.6), dpi=_DPI)
    axes_list = figure.subplots(len(labels), 1, squeeze=False)[:, 0]
    drawn = ["ols", *[m for m in models if m in by_model]]
    for axes, label in zip(axes_list, labels, strict=True):
        raw_trace = next(t for t in raw.case if t.label == label)
        times = _times(raw_trace.timestamps_s)
        axes.plot(times, _series(raw_trace.values), color="0.6", lw=1.0, label="raw")
        axes.plot(times, _series(raw_trace.reference), color="k", lw=1.6, label="reference")
        for index, model in enumerate(drawn):
            result = by_model.get(model)
            trace = next((t for t in result.case if t.label == label), None) if result else None
            if trace is None:
                continue
            style = "--" if model == "ols" else "-"
            axes.plot(_times(trace.timestamps_s), _series(trace.values), style,
                      color=_colour(model, index), lw=1.1, label=model)  # fmt: skip
        axes.set_title(f"{label} concentration period", fontsize=10, loc="left")
        axes.set_ylabel("µg/m³")
        axes.grid(True, alpha=0.3)
    axes_list[-1].set_xlabel("time (UTC)")
    handles, names = axes_list[0].get_legend_handles_labels()
    figure.legend(handles, names, loc="upper center", ncol=len(names), fontsize=9,
                  bbox_to_anchor=(0.5, 0.965), frameon=False)  # fmt: skip
    figure.suptitle(title)
    figure.tight_layout(rect=(0, 0, 1, 0.94))
    figure.savefig(path)
    return path


def draw_all(
    report_dir: Path,
    results: Sequence[CellResult],
    config: BenchConfig,
    efficiency_rows: Sequence[dict[str, object]],
    sweep_rows: Sequence[dict[str, object]],
) -> list[Path]:
    """Every figure of the report; returns the files written."""
    written: list[Path] = []
    for spec in config.datasets:
        key = spec.key
        mine = [r for r in results if r.dataset == key]
        raw = next((r for r in mine if r.model == "raw"), None)
        if raw is None:
            continue
        name = f"{raw.region} {raw.feature}"
        n = config.window_length
        figures = (
            efficiency(
                report_dir / f"efficiency_{key}.png",
                [r for r in efficiency_rows if r["dataset"] == key],
                f"Efficiency — {name}, N = {n}",
            ),
            window_sweep(
                report_dir / f"window_sweep_{key}.png",
                [r for r in sweep_rows if r["dataset"] == key],
                f"Window sweep — {name}",
            ),
            case_study(
                report_dir / f"case_study_{key}.png",
                [r for r in mine if r.window_length == n],
                config.case_study_models,
                f"Case study — {name}, test sensor {raw.test_sensor}, N = {n}",
            ),
        )
        written += [f for f in figures if f is not None]
    return written

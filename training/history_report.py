"""The partial-history curve of a model directory on its test sensor: a JSON, a table, a plot.

Every point is ``evaluate --history-periods K`` (the gateway's calibrator on windows that kept
only their newest K periods, edge-padded) restricted to the manifest's test sensor, beside the
linear calibration's test RMSE (the manifest's: it reads only the newest period, so it is the
same for every K) and, optionally, a baseline model directory scored the same way (e.g. the
model before it was trained on short histories). docs/benchmarks/partial-history/ holds one per
committed default model.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from tesla_gateway.contract.manifest import load_manifest
from training.data import CoLocationData
from training.errors import DataError
from training.evaluate import evaluate_model_dir
from training.history import history_points

__all__ = ["CurvePoint", "HistoryReport", "HistoryTarget", "measure", "write_report"]

_DPI = 90
WHOLE_WINDOW_TOLERANCE = 0.02  # issue 27: K = N within 2 % of the previous model's RMSE


@dataclass(frozen=True)
class HistoryTarget:
    """From ``periods`` of history on, the model's RMSE is at most ``max_ratio`` x linear's."""

    periods: int
    max_ratio: float
    label: str


@dataclass(frozen=True)
class CurvePoint:
    periods: int
    rmse: float
    mae: float
    n: int
    coverage: float | None  # share of references inside the published interval
    mean_width: float | None
    baseline_rmse: float | None  # the baseline model directory at the same K


@dataclass(frozen=True)
class HistoryReport:
    model: str
    version: int
    test_sensor: str
    window_length: int
    period_seconds: int
    calibrates_from: int
    linear_rmse: float
    baseline: str | None
    points: list[CurvePoint]

    def ratio_from(self, periods: int) -> float:
        """The worst RMSE over linear's at ``periods`` or more history (a target holds "from"
        its K on, not at that K alone)."""
        ratios = [p.rmse / self.linear_rmse for p in self.points if p.periods >= periods]
        if not ratios or self.points[0].periods > periods:
            raise DataError(f"the curve of {self.model} does not reach down to K = {periods}")
        return max(ratios)

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def measure(
    model_dir: Path,
    data: CoLocationData,
    *,
    points: tuple[int, ...] | None = None,
    baseline_dir: Path | None = None,
) -> HistoryReport:
    """Score the test sensor at every history length of ``points`` (default: the log-spaced
    set of :func:`training.history.history_points`)."""
    manifest = load_manifest(model_dir)
    sensor = manifest.data.test_sensor
    only_test = data.with_frame(data.frame[data.frame["sensor_id"] == sensor])
    if only_test.frame.empty:
        raise DataError(f"the data has no reading of {manifest.name}'s test sensor {sensor}")
    chosen = points or history_points(manifest.window_length, manifest.period_seconds)
    curve = []
    for k in chosen:
        evaluation = evaluate_model_dir(model_dir, only_test, history_periods=k)
        if evaluation.n != manifest.test.linear.n:
            raise DataError(
                f"{evaluation.n} windows scored on {sensor}, the manifest's linear RMSE has "
                f"{manifest.test.linear.n}: this is not the data the model was tested on"
            )
        before = (
            None
            if baseline_dir is None
            else evaluate_model_dir(baseline_dir, only_test, history_periods=k).model.rmse
        )
        intervals = evaluation.intervals
        curve.append(
            CurvePoint(
                periods=k,
                rmse=evaluation.model.rmse,
                mae=evaluation.model.mae,
                n=evaluation.n,
                coverage=None if intervals is None else intervals.coverage,
                mean_width=None if intervals is None else intervals.mean_width,
                baseline_rmse=before,
            )
        )
    return HistoryReport(
        model=manifest.name,
        version=manifest.version,
        test_sensor=sensor,
        window_length=manifest.window_length,
        period_seconds=manifest.period_seconds,
        calibrates_from=manifest.calibrates_from,
        linear_rmse=manifest.test.linear.rmse,
        baseline=None if baseline_dir is None else load_manifest(baseline_dir).name,
        points=curve,
    )


def _span(periods: int, period_seconds: int) -> str:
    seconds = periods * period_seconds
    for unit, size in (("d", 86_400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def table(report: HistoryReport, targets: tuple[HistoryTarget, ...] = ()) -> str:
    """The curve as a markdown table, then the targets and whether each is met."""
    unit = "µg/m³"
    baseline = report.baseline is not None
    lines = [
        f"# {report.model} v{report.version}: error by history length",
        "",
        f"Test sensor {report.test_sensor}, {report.points[0].n} windows; N = "
        f"{report.window_length} periods of {report.period_seconds} s; calibrates from "
        f"{report.calibrates_from} period(s). Linear calibration (newest reading only): RMSE "
        f"{report.linear_rmse:.2f} {unit} at every K. "
        + (
            f"Before: {report.baseline}, the model given as the baseline (`--baseline`), fed "
            "the same padded windows."
            if baseline
            else ""
        ),
        "",
        "| K (periods) | history | RMSE | vs linear | MAE | 90 % interval coverage | mean width"
        + (" | before |" if baseline else " |"),
        "|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if baseline else ""),
    ]
    for p in report.points:
        coverage = "" if p.coverage is None else f"{p.coverage:.1%}"
        width = "" if p.mean_width is None else f"{p.mean_width:.2f}"
        row = (
            f"| {p.periods} | {_span(p.periods, report.period_seconds)} | {p.rmse:.2f} | "
            f"{p.rmse / report.linear_rmse - 1:+.1%} | {p.mae:.2f} | {coverage} | {width} |"
        )
        if baseline:
            row += "" if p.baseline_rmse is None else f" {p.baseline_rmse:.2f} |"
        lines.append(row)
    whole = report.points[-1]
    if targets or (baseline and whole.baseline_rmse):
        lines += ["", "| target | measured | met |", "|---|---:|:---:|"]
    for target in targets:
        ratio = report.ratio_from(target.periods)
        met = "yes" if ratio <= target.max_ratio else "**no**"
        lines.append(f"| {target.label} | worst {ratio - 1:+.1%} vs linear | {met} |")
    if baseline and whole.baseline_rmse and whole.periods == report.window_length:
        change = whole.rmse / whole.baseline_rmse - 1
        met = "yes" if change <= WHOLE_WINDOW_TOLERANCE else "**no**"
        lines.append(
            f"| whole window (K = N) within {WHOLE_WINDOW_TOLERANCE:.0%} of before | "
            f"{change:+.1%} vs before | {met} |"
        )
    return "\n".join(lines) + "\n"


def plot(report: HistoryReport, path: Path) -> Path:
    """RMSE against history length (log axis), linear as a line, the baseline dashed."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 4.2))
    axes = figure.subplots()
    ks = [p.periods for p in report.points]
    axes.plot(ks, [p.rmse for p in report.points], "o-", color="#c0392b", label=report.model)
    if report.baseline is not None:
        axes.plot(
            ks,
            [float("nan") if p.baseline_rmse is None else p.baseline_rmse for p in report.points],
            "s--",
            color="#7f8c8d",
            label="before (not trained on short histories)",
        )
    axes.axhline(report.linear_rmse, color="#1f77b4", label="linear calibration")
    axes.set_xscale("log")
    axes.set_xticks(ks, [_span(k, report.period_seconds) for k in ks], rotation=45, fontsize=8)
    axes.minorticks_off()
    axes.set_xlabel("history the sensor has (periods since its first reading)")
    axes.set_ylabel("RMSE on the test sensor (µg/m³)")
    axes.set_title(f"{report.model} v{report.version}, test sensor {report.test_sensor}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI)
    return path


def write_report(
    report: HistoryReport, out: Path, targets: tuple[HistoryTarget, ...] = ()
) -> list[Path]:
    """``<model>.json``, ``<model>.md`` and ``<model>.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / report.model
    document = {
        **report.as_dict(),
        "targets": [
            {
                **asdict(t),
                "worst_ratio": report.ratio_from(t.periods),
                "met": report.ratio_from(t.periods) <= t.max_ratio,
            }
            for t in targets
        ],
    }
    json_path = stem.with_suffix(".json")
    json_path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    md_path = stem.with_suffix(".md")
    md_path.write_text(table(report, targets), encoding="utf-8")
    return [json_path, md_path, plot(report, stem.with_suffix(".png"))]

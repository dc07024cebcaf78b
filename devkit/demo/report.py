"""The end of the demo: a summary table, the traces as CSV, and a PNG plot.

matplotlib is imported only here and only when plotting: it belongs to the ``train`` extra, and
a gateway installed on a Raspberry Pi does not have it (the demo then says so and skips the plot).
"""

from __future__ import annotations

import csv
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devkit.demo.replay_slice import DemoSlice
from devkit.demo.scoreboard import Scoreboard

__all__ = ["summary_table", "write_plot", "write_traces"]


def _fmt(value: float) -> str:
    return f"{value:.2f}" if math.isfinite(value) else "—"


def summary_table(board: Scoreboard, roles: dict[str, str]) -> str:
    """Per sensor: periods sent, back, calibrated, warm-up, and the errors vs the reference."""
    header = (
        f"{'sensor':<8} {'link':<6} {'role in training':<17} {'sent':>5} {'back':>5} "
        f"{'calibrated':>10} {'warm-up':>7} {'gap':>4}  {'RMSE raw':>8} {'RMSE cal':>8} "
        f"{'MAE raw':>8} {'MAE cal':>8}  model"
    )
    lines = [header, "-" * len(header)]
    for score in board.sensors.values():
        lines.append(
            f"{score.sensor_id:<8} {score.link:<6} {roles.get(score.sensor_id, '—'):<17} "
            f"{score.sent:>5} {len(score.outputs):>5} {score.calibrated:>10} "
            f"{score.warming_up:>7} {score.gap:>4}  {_fmt(score.rmse_raw):>8} "
            f"{_fmt(score.rmse_calibrated):>8} {_fmt(score.mae_raw):>8} "
            f"{_fmt(score.mae_calibrated):>8}  {score.model}"
        )
    return "\n".join(lines)


def write_traces(board: Scoreboard, path: Path) -> Path:
    """Every period that came back, with its reference (for your own plots)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "period_start",
                "sensor_id",
                "link",
                "raw",
                "calibrated",
                "reference",
                "quality",
                "model",
                "interval_low",
                "interval_high",
                "history_periods",
            ]
        )
        for score in board.sensors.values():
            for start in sorted(score.outputs):
                output = score.outputs[start]
                writer.writerow(
                    [
                        datetime.fromtimestamp(start, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        score.sensor_id,
                        score.link,
                        "" if output.raw is None else output.raw,
                        "" if output.calibrated is None else round(output.calibrated, 3),
                        "" if not math.isfinite(output.reference) else output.reference,
                        " ".join(output.quality),
                        output.model or "",
                        "" if output.low is None else round(output.low, 3),
                        "" if output.high is None else round(output.high, 3),
                        "" if output.history_periods is None else output.history_periods,
                    ]
                )
    return path


def write_plot(
    board: Scoreboard,
    demo_slice: DemoSlice,
    path: Path,
    roles: dict[str, str],
    *,
    title: str,
    window_length: int,
) -> Path | None:
    """Raw, calibrated (with its 90 % interval as a band) and reference traces per sensor, the
    model that calibrated each; None if matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    sensors = list(board.sensors.values())
    figure, axes = plt.subplots(
        len(sensors), 1, figsize=(12, 3.2 * len(sensors)), sharex=True, squeeze=False
    )
    for axis, score in zip(axes[:, 0], sensors, strict=True):
        _plot_sensor(axis, score, demo_slice, roles.get(score.sensor_id, ""), window_length)
    axes[-1, 0].set_xlabel("time (UTC), replayed")
    figure.suptitle(title)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def _plot_sensor(axis: Any, score: Any, demo_slice: DemoSlice, role: str, n: int) -> None:
    starts = sorted(score.outputs)
    times = [datetime.fromtimestamp(start, UTC) for start in starts]
    outputs = [score.outputs[start] for start in starts]
    raw = [math.nan if o.raw is None else o.raw for o in outputs]
    calibrated = [math.nan if o.calibrated is None else o.calibrated for o in outputs]
    if starts:  # the reference over the replayed span only
        rows = [
            r for r in demo_slice.rows[score.sensor_id] if starts[0] <= r.timestamp <= starts[-1]
        ]
    else:
        rows = []
    axis.plot(
        [datetime.fromtimestamp(r.timestamp, UTC) for r in rows],
        [r.reference for r in rows],
        color="black",
        linewidth=1.2,
        label="reference (station)",
    )
    axis.plot(times, raw, color="tab:gray", linewidth=0.8, alpha=0.8, label="raw (PMS5003)")
    low = [math.nan if o.low is None else o.low for o in outputs]
    high = [math.nan if o.high is None else o.high for o in outputs]
    if any(math.isfinite(value) for value in high):
        axis.fill_between(
            times, low, high, color="tab:blue", alpha=0.18, linewidth=0, label="90 % interval"
        )
    axis.plot(times, calibrated, color="tab:blue", linewidth=1.0, label="calibrated (gateway)")
    warm = [t for t, o in zip(times, outputs, strict=True) if "warming_up" in o.quality]
    if warm:
        axis.axvspan(warm[0], warm[-1], color="tab:orange", alpha=0.12, label="warm-up")
    young = [
        t
        for t, o in zip(times, outputs, strict=True)
        if o.calibrated is not None and o.history_periods is not None and o.history_periods < n
    ]
    if young:  # calibrated from a window not yet whole: the interval is wider there
        axis.axvline(young[-1], color="tab:green", linewidth=0.9, linestyle="--")
        axis.annotate(
            f"whole window ({n} periods) from here",
            (young[-1], 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(4, -12),
            textcoords="offset points",
            fontsize=7,
            color="tab:green",
        )
    axis.set_ylabel("PM10 µg/m³")
    models = ", ".join(sorted(score.models)) or "no calibration"
    axis.set_title(
        f"{score.sensor_id} via {score.link}{f' ({role})' if role else ''}, model {models}: "
        f"RMSE raw {_fmt(score.rmse_raw)} → calibrated {_fmt(score.rmse_calibrated)} µg/m³ "
        f"over {score.scored} periods",
        fontsize=10,
    )
    axis.grid(alpha=0.3)
    axis.legend(loc="upper right", fontsize=8)

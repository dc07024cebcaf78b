"""The case study (paper Figure 7): a low, a mid and a high concentration period of the test sensor.

The test sensor's time span is cut into consecutive blocks of ``length`` grid periods; blocks
with at least 90 % of their windows present are candidates (50 % if none qualifies). By mean
reference concentration, *low* is the lowest block, *high* the highest and *mid* the block
nearest the median of the block means. The choice depends only on the data, so every model is
drawn over the same periods.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from training.bench.cells import CaseTrace

__all__ = ["CasePeriod", "select_case_periods", "trace"]

_COVERAGE = (0.9, 0.5)


@dataclass(frozen=True)
class CasePeriod:
    label: str  # "low", "mid" or "high"
    timestamps_s: npt.NDArray[np.int64]  # every grid period of the block, Unix s


def select_case_periods(
    timestamps_s: npt.ArrayLike, reference: npt.ArrayLike, period_seconds: int, length: int
) -> list[CasePeriod]:
    """Low, mid and high blocks of ``length`` periods (fewer if the data has fewer blocks)."""
    stamps = np.asarray(timestamps_s, dtype=np.int64)
    values = np.asarray(reference, dtype=np.float64)
    keep = np.isfinite(values)
    stamps, values = stamps[keep], values[keep]
    if stamps.size == 0:
        return []
    first = int(stamps.min())
    span = length * period_seconds
    block = (stamps - first) // span
    counts = np.bincount(block)
    sums = np.bincount(block, weights=values)
    for coverage in _COVERAGE:
        candidates = np.flatnonzero(counts >= coverage * length)
        if candidates.size:
            break
    else:
        return []
    means = sums[candidates] / counts[candidates]
    order = np.argsort(means, kind="stable")
    chosen = {"low": int(candidates[order[0]]), "high": int(candidates[order[-1]])}
    inner = order[1:-1]
    if inner.size:
        median = float(np.median(means))
        nearest = inner[np.argmin(np.abs(means[inner] - median))]
        chosen["mid"] = int(candidates[nearest])
    periods = []
    used: set[int] = set()
    for label in ("low", "mid", "high"):
        number = chosen.get(label)
        if number is None or number in used:
            continue
        used.add(number)
        start = first + number * span
        grid = start + np.arange(length, dtype=np.int64) * period_seconds
        periods.append(CasePeriod(label=label, timestamps_s=grid))
    return periods


def trace(
    period: CasePeriod,
    timestamps_s: npt.NDArray[np.int64],
    reference: npt.ArrayLike,
    values: npt.ArrayLike,
) -> CaseTrace:
    """Reference and ``values`` on the period's grid (None where no window ends there)."""
    position = {int(t): i for i, t in enumerate(np.asarray(timestamps_s, dtype=np.int64))}
    ref = np.asarray(reference, dtype=np.float64)
    val = np.asarray(values, dtype=np.float64)

    def pick(series: npt.NDArray[np.float64]) -> list[float | None]:
        out: list[float | None] = []
        for t in period.timestamps_s:
            i = position.get(int(t))
            out.append(
                None if i is None or not np.isfinite(series[i]) else round(float(series[i]), 3)
            )
        return out

    return CaseTrace(
        label=period.label,  # type: ignore[arg-type]
        timestamps_s=[int(t) for t in period.timestamps_s],
        reference=pick(ref),
        values=pick(val),
    )

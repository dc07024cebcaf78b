"""The bound on what a model may publish: a number no concentration could be is not ``ok``.

A signed model can still compute nonsense (wrong weights, a broken export, a graph that
extrapolates wildly): raw 20 µg/m³ in, -10,770 out. The gateway checks every output against the
model's own manifest and publishes it only inside these bounds (docs/mqtt.md, "implausible"):

* **below zero beyond the interval**: ``value + w < 0``, with ``w`` the half-width of the
  manifest's prediction interval for that value (its conformal bin). The whole interval
  ``[value - w, value + w]`` then lies below zero: the model claims, at its own confidence
  level, a concentration that cannot exist. Small negatives inside ``w`` stay ``ok`` (an
  unbiased model near zero must be allowed them). Without intervals in the manifest ``w`` is
  ``RMSE_HALF_WIDTHS`` x the validation RMSE (about a 95 % half-width for normal errors).
* **far above anything seen**: ``value > HIGH_FACTOR * max(trained_max, raw)``, with
  ``trained_max`` the largest reference value of the training windows (manifest
  ``target_range.max``; manifests written before that field use the training inputs'
  ``input_range.max``) and ``raw`` the period's raw mean. The sensor's own reading is in the
  bound so that a real pollution event beyond the training range is not silenced; the factor
  allows a sensor that under-reads by up to 4x. Measured on the three default models
  (training, validation and test windows of their datasets): the reference itself never
  exceeded 0.94 x max(trained_max, raw), the models 0.80, and constant windows up to 50x the
  training inputs' maximum 0.57 (the models saturate), so 4 leaves a wide margin while a
  broken graph's 1e4 is beyond it by orders of magnitude.
* **not a number**: NaN or an infinity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tesla_gateway.contract.manifest import Manifest

__all__ = ["HIGH_FACTOR", "RMSE_HALF_WIDTHS", "PlausibleRange"]

HIGH_FACTOR = 4.0
RMSE_HALF_WIDTHS = 2.0

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class PlausibleRange:
    """One model's bounds, computed once from its manifest; checks a batch in a few passes."""

    edges: FloatArray  # ascending calibrated values between interval bins
    half_widths: FloatArray  # one per bin, len(edges) + 1
    trained_max: float  # the largest value the model learned to output
    trained_max_source: str  # the manifest field it comes from, for messages

    @classmethod
    def of(cls, manifest: Manifest) -> PlausibleRange:
        intervals = manifest.intervals
        if intervals is not None:
            edges = np.asarray(intervals.edges, dtype=np.float64)
            widths = np.asarray(intervals.half_widths, dtype=np.float64)
        else:
            edges = np.empty(0, dtype=np.float64)
            widths = np.asarray([RMSE_HALF_WIDTHS * manifest.validation.rmse], dtype=np.float64)
        if manifest.target_range is not None:
            trained_max, source = manifest.target_range.max, "target_range.max"
        else:
            trained_max, source = manifest.input_range.max, "input_range.max"
        return cls(edges, widths, max(trained_max, 0.0), source)

    def implausible(self, values: npt.ArrayLike, raw: npt.ArrayLike) -> BoolArray:
        """Per row, is ``values[i]`` (calibrated from a period of raw mean ``raw[i]``) outside
        the bounds? ``values`` and ``raw`` are ``[B]``; a NaN ``raw`` counts as 0."""
        value = np.asarray(values, dtype=np.float64)
        period_raw = np.asarray(raw, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            # NaN and +inf sort after every edge: they take the last bin and are caught below.
            width = self.half_widths[np.searchsorted(self.edges, value, side="right")]
            below = value + width < 0
            above = value > HIGH_FACTOR * np.fmax(self.trained_max, period_raw)
        return np.asarray(~np.isfinite(value) | below | above, dtype=np.bool_)

    def reason(self, value: float, raw: float) -> str:
        """Why one value is implausible, in words an operator can check against the manifest."""
        if not math.isfinite(value):
            return f"the model returned {value}"
        width = float(self.half_widths[int(np.searchsorted(self.edges, value, side="right"))])
        if value + width < 0:
            return (
                f"{value:.6g} µg/m³ lies below zero by more than its interval half-width "
                f"{width:.4g}"
            )
        ceiling = HIGH_FACTOR * max(self.trained_max, raw if math.isfinite(raw) else 0.0)
        return (
            f"{value:.6g} µg/m³ exceeds {HIGH_FACTOR:g} x max(trained maximum "
            f"{self.trained_max:.4g} ({self.trained_max_source}), raw {raw:.4g}) = {ceiling:.4g}"
        )

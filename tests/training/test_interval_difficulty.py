"""Window-difficulty candidates for the intervals (training/interval_difficulty.py) on synthetic
units: the binned candidate is the published method, a normalised width follows a difficulty
that explains the errors, and the choosing rule keeps what the benchmark page wrote."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from training.cross_conformal import UnitResiduals, fit_cross_unit, unit_scores
from training.interval_difficulty import (
    CANDIDATES,
    DIFFICULTIES,
    DifficultUnit,
    candidate_figures,
    choose,
    fit_widths,
    unit_profile,
)

BINNED, NORMALISED, MONDRIAN = CANDIDATES[0], CANDIDATES[3], CANDIDATES[4]


def unit(name: str, spread: float, seed: int, n: int = 1500) -> DifficultUnit:
    """A unit whose windows' difficulty ``d`` sets its error scale (``spread`` moves it)."""
    rng = np.random.default_rng(seed)
    predicted = rng.uniform(5.0, 60.0, n)
    d = spread * rng.uniform(0.5, 1.5, n)
    reference = predicted + d * rng.normal(size=n)
    difficulty = {"recent_spread": d, "raw_vs_calibrated": d}
    return DifficultUnit(name, "train", predicted, reference, difficulty)


def test_the_binned_candidate_is_the_published_method() -> None:
    units = [unit(f"u{i}", s, i) for i, s in enumerate((1.0, 2.0, 3.0))]
    published = fit_cross_unit(
        [UnitResiduals(u.sensor, u.role, u.predicted, u.reference) for u in units],
        validation_sensor="u0",
        quantile_levels=(),
    )
    fitted = fit_widths(units, BINNED)
    assert fitted.widths.tolist() == published.half_widths
    other = unit("new", 1.5, 9)
    scores = unit_scores(published, UnitResiduals("new", "test", other.predicted, other.reference))
    assert fitted.score(other) == pytest.approx((scores.coverage, scores.mean_width))


def test_a_width_normalised_by_a_difficulty_that_explains_the_errors_covers_every_unit() -> None:
    units = [unit(f"u{i}", s, i) for i, s in enumerate((0.5, 1.0, 2.0, 4.0))]
    figures = {
        c.name: candidate_figures({"whole": units}, {"whole": unit("t", 1.0, 7)}, c)["whole"]
        for c in (BINNED, NORMALISED)
    }
    binned = figures["binned"]["units"]
    # one width per bin: the calm unit over-covered, the wild one under-covered
    assert binned["u0"]["coverage"] > 0.97 and binned["u3"]["coverage"] < 0.5
    normalised = figures[NORMALISED.name]
    # held out, the wildest unit is an extrapolation (and beta damps the scaling): much
    # closer, not at 90 %
    assert normalised["units"]["u3"]["coverage"] > binned["u3"]["coverage"] + 0.2
    assert normalised["mean_abs_deviation"] < 0.6 * figures["binned"]["mean_abs_deviation"]


def test_flat_windows_fall_back_to_the_binned_widths() -> None:
    flat = [
        DifficultUnit(u.sensor, u.role, u.predicted, u.reference,
                      {k: np.zeros_like(v) for k, v in u.difficulty.items()})
        for u in (unit(f"u{i}", s, i) for i, s in enumerate((1.0, 2.0)))
    ]  # fmt: skip
    binned = fit_widths(flat, BINNED)
    for candidate in (NORMALISED, MONDRIAN):
        fitted = fit_widths(flat, candidate)
        assert fitted.half_widths(flat[0]) == pytest.approx(binned.half_widths(flat[0]))


def test_window_difficulties_on_a_flat_and_a_moving_window() -> None:
    pm = np.array([[5.0] * 12, [0.0, 10.0] * 6])
    predicted = np.array([3.0, 4.0])
    assert DIFFICULTIES["recent_spread"](pm, predicted).tolist() == [0.0, 5.0]
    assert DIFFICULTIES["spikiness"](pm, predicted).tolist() == [0.0, 10.0]
    assert DIFFICULTIES["raw_vs_calibrated"](pm, predicted).tolist() == [2.0, 6.0]


def report(
    figures: dict[str, tuple[float, float, float]], short: dict[str, float] | None = None
) -> dict[str, Any]:
    """A model's report: per candidate (mean coverage, mean abs deviation, width) of whole
    windows, and the mean coverage of one short-history bucket (90 % unless ``short``)."""
    return {
        "candidates": {
            name: {
                "whole": {"mean_coverage": c, "mean_abs_deviation": d, "mean_width": w},
                "1": {"mean_coverage": (short or {}).get(name, 0.9)},
            }
            for name, (c, d, w) in figures.items()
        }
    }


def test_the_rule_needs_the_band_on_every_model_before_the_spread() -> None:
    inside = report({"binned": (0.89, 0.05, 10.0), "x": (0.90, 0.02, 11.0)})
    below = report({"binned": (0.885, 0.07, 10.0), "x": (0.8799, 0.03, 11.0)})
    decision = choose([inside, below])
    assert decision["qualified"] == ["binned"] and not decision["replaces_binned"]
    fine = report({"binned": (0.885, 0.07, 10.0), "x": (0.89, 0.03, 11.0)})
    assert choose([inside, fine])["replaces_binned"]
    # a winner whose short histories drift from 90 % further than binned's (+1 point) stays out
    shorts = {"binned": 0.895, "x": 0.88}
    drifting = report({"binned": (0.885, 0.07, 10.0), "x": (0.89, 0.03, 11.0)}, shorts)
    decision = choose([inside, drifting])
    assert decision["winner"] == "x" and not decision["replaces_binned"]


def test_ties_go_to_the_narrower_width() -> None:
    figures = {"binned": (0.89, 0.05, 10.0), "x": (0.90, 0.031, 11.0), "y": (0.90, 0.03, 12.0)}
    assert choose([report(figures)])["winner"] == "x"
    figures["y"] = (0.90, 0.02, 12.0)  # clearly less spread: the width no longer decides
    assert choose([report(figures)])["winner"] == "y"


def test_a_unit_profile_shows_an_offset_the_window_does_not() -> None:
    base = unit("u", 1.0, 3)
    offset = DifficultUnit("o", "train", base.predicted, base.reference + 3.0, base.difficulty)
    plain, shifted = unit_profile(base), unit_profile(offset)
    assert shifted["mean_error"] == pytest.approx(plain["mean_error"] + 3.0, abs=1e-3)
    assert shifted["median_difficulty"] == plain["median_difficulty"]
    assert plain["abs_error_correlation"]["recent_spread"] > 0.3  # errors follow d here

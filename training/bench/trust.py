"""The bench's trust figures for one learned cell: what a user of the model would be told.

Intervals are fitted on the validation sensor exactly as export fits them and scored on the test
sensor; the EU GDE figures are computed on the test sensor's daily means.
"""

from __future__ import annotations

import keras
import pandas as pd

from training.bench.cells import TrustScores
from training.conformal import fit_intervals, score_intervals
from training.equivalence import equivalence
from training.errors import DataError
from training.train import PreparedData, predict_windows

__all__ = ["measure_trust"]


def measure_trust(model: keras.Model, prepared: PreparedData) -> TrustScores:
    """Coverage and width of the validation-fitted intervals and the GDE figures, on test."""
    test_predicted = predict_windows(model, prepared.test)
    test_reference = prepared.test.targets()
    scores: dict[str, object] = {}
    try:
        intervals = fit_intervals(
            predict_windows(model, prepared.validation),
            prepared.validation.targets(),
            sensor=prepared.summary.validation_sensor,
        )
    except DataError:
        intervals = None
    if intervals is not None:
        measured = score_intervals(intervals, test_predicted, test_reference)
        scores |= {
            "interval_level": measured.level,
            "interval_coverage": measured.coverage,
            "interval_mean_width": measured.mean_width,
        }
    meta = prepared.test.meta()
    frame = pd.DataFrame(
        {
            "timestamp": meta["timestamp"],
            "sensor_id": meta["sensor_id"],
            "reference": test_reference.astype(float),
            "calibrated": test_predicted,
        }
    )
    agreement = equivalence(
        frame, feature=prepared.data.feature, period_seconds=prepared.data.period_seconds
    )
    if agreement is not None:
        scores |= {
            "gde_days": agreement.days,
            "gde_limit_value": agreement.limit_value,
            "gde_expanded_relative_uncertainty": agreement.expanded_relative_uncertainty,
            "gde_slope": agreement.slope,
            "gde_intercept": agreement.intercept,
            "gde_r2": agreement.r2,
            "meets_indicative_dqo": agreement.meets_indicative_dqo,
        }
    return TrustScores.model_validate(scores)

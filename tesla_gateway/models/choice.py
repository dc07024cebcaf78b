"""Which of a feature's models calibrates a sensor's period: the best one its inputs allow.

A feature may have several models that differ in their input channels (PM alone; PM with
relative humidity and temperature). Every model runs over the windows it holds, and for each
(sensor, period) one reading is published: the calibrated one of the highest-ranked model, where
rank is the number of input channels, then the lower validation RMSE of the manifest. A sensor
that does not report a covariate has no window (or an invalid one) in the covariate model and
gets the PM-only model; one whose humidity stops arriving falls back as soon as its covariate
window turns invalid (a gap longer than the gap rule, a missing channel) and returns once it is
valid again. When no model calibrated the period, the reading of the model with the fewest
channels is published, with that model's reason (warming up, gap), as with one model. A
``stuck`` verdict of any model wins, whatever another calibrated: the sensor is frozen whichever
model reads it (a covariate model that admitted it late has counted a shorter run).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from tesla_gateway.contract.calibrated import CalibratedReading, Quality
from tesla_gateway.models.calibrator import Calibrator

__all__ = ["ModelRank", "choose_per_sensor", "model_rank"]

ModelRank = tuple[int, float]


def model_rank(calibrator: Calibrator | None) -> ModelRank:
    """Larger is preferred: (channels read from the sensor, -validation RMSE); the hour of the
    day, which every sensor has, does not count as a channel the sensor brought."""
    if calibrator is None:
        return (0, -math.inf)
    return (len(calibrator.geometry.read_channels), -calibrator.manifest.validation.rmse)


def choose_per_sensor(
    results: Sequence[tuple[ModelRank, Sequence[CalibratedReading]]],
) -> list[CalibratedReading]:
    """One reading per (sensor, feature, period) out of every model's readings.

    The order of the first occurrence is kept, so one sensor's periods stay in order.
    """
    if len(results) == 1:
        return list(results[0][1])
    chosen: dict[tuple[str, str, float], tuple[ModelRank, CalibratedReading]] = {}
    for rank, readings in results:
        for reading in readings:
            key = (reading.sensor_id, reading.feature, reading.period_start)
            held = chosen.get(key)
            if held is None or _better(rank, reading, *held):
                chosen[key] = (rank, reading)
    return [reading for _, reading in chosen.values()]


def _better(
    rank: ModelRank, reading: CalibratedReading, held_rank: ModelRank, held: CalibratedReading
) -> bool:
    stuck, held_stuck = Quality.STUCK in reading.quality, Quality.STUCK in held.quality
    if stuck != held_stuck:
        return stuck
    if (reading.calibrated is None) != (held.calibrated is None):
        return reading.calibrated is not None
    if reading.calibrated is not None:
        return rank > held_rank
    return rank < held_rank  # neither calibrated: the simplest model's reason is the useful one

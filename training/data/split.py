"""The paper's split: sensors sorted by id, the last two held out for validation and test.

Splitting by sensor, not by time, measures what matters for a product: calibration of a unit the
model has never seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from training.errors import DataError

__all__ = ["SensorSplit", "paper_split"]


@dataclass(frozen=True)
class SensorSplit:
    """Which sensors train, which one selects the model, which one reports the score."""

    train: tuple[str, ...]
    validation: str
    test: str

    def role(self, sensor_id: str) -> str:
        """``train``, ``validation`` or ``test`` for a sensor of this split."""
        if sensor_id == self.test:
            return "test"
        if sensor_id == self.validation:
            return "validation"
        if sensor_id in self.train:
            return "train"
        raise KeyError(f"sensor {sensor_id!r} is not part of this split")


def paper_split(sensor_ids: Iterable[str]) -> SensorSplit:
    """Sorted by id: second-to-last is validation, last is test, the rest train."""
    ordered = sorted(set(sensor_ids))
    if len(ordered) < 3:
        raise DataError(
            f"the paper's split needs at least 3 sensors (train, validation, test); "
            f"got {len(ordered)}: {ordered}. Cleaning may have dropped some; see its report"
        )
    return SensorSplit(train=tuple(ordered[:-2]), validation=ordered[-2], test=ordered[-1])

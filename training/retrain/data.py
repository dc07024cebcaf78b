"""The data side of retraining: the held-back period, the time split, the windows to train on.

Pairs are split by time, never by sensor: the most recent periods are held back to compare the
models, the ones before train the challenger and the most recent of those pick its epoch. A
period's reference is masked out of every set it does not belong to while the raw readings stay,
so a window may look back across a boundary (as the gateway's windows do) but is scored or
learned from only in the set its newest period belongs to.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from pydantic import BaseModel, ConfigDict, Field, model_validator

from tesla_gateway.contract.series import GapPolicy
from training.data import CoLocationData, GriddedSensor, RecordedPairs, WindowSet, to_grid
from training.data.frame import LoadCounts, unix_seconds
from training.errors import HoldoutError

__all__ = [
    "BEFORE_SINCE",
    "HoldBack",
    "Periods",
    "TrainingSets",
    "duration_text",
    "iso",
    "masked",
    "only_references_from",
    "pairs_since",
    "split_periods",
    "training_sets",
]

BEFORE_SINCE = "pairs:before_since"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


class HoldBack(BaseModel):
    """The most recent part of the pairs: kept out of training, used to compare the models.

    Written ``12h``, ``7d``, ``90m``, ``3600s`` (a duration ending at the last recorded period)
    or ``0.2`` / ``20%`` (that share of the recorded periods, the most recent ones).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["duration", "fraction"]
    value: float = Field(gt=0, description="Seconds for a duration, a share in (0, 1) otherwise.")

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        if not isinstance(data, str | int | float) or isinstance(data, bool):
            return data
        text = str(data).strip()
        duration = _DURATION.match(text)
        if duration is not None:
            return {
                "kind": "duration",
                "value": float(duration.group(1)) * _UNIT_SECONDS[duration.group(2)],
            }
        share = text.removesuffix("%")
        try:
            value = float(share) / (100.0 if share != text else 1.0)
        except ValueError:
            raise ValueError(
                f"held-back period {text!r}: write a duration (12h, 7d, 90m, 3600s) or a share "
                "of the recorded periods (0.2 or 20%)"
            ) from None
        return {"kind": "fraction", "value": value}

    @model_validator(mode="after")
    def _share_below_one(self) -> HoldBack:
        if self.kind == "fraction" and not 0 < self.value < 1:
            raise ValueError(f"a held-back share must lie in (0, 1), got {self.value}")
        return self

    def describe(self) -> str:
        if self.kind == "fraction":
            return f"the most recent {self.value:.0%} of the recorded periods"
        return f"the last {duration_text(self.value)} of pairs"


@dataclass(frozen=True)
class Periods:
    """Unix-second boundaries: training < validation_start <= validation < holdout_start."""

    validation_start: float
    holdout_start: float
    first: float
    last: float

    def as_json(self) -> dict[str, str | None]:
        has_validation = self.validation_start < self.holdout_start
        return {
            "training": f"{iso(self.first)}/{iso(self.validation_start)}",
            "validation": (
                f"{iso(self.validation_start)}/{iso(self.holdout_start)}"
                if has_validation
                else None
            ),
            "held_back": f"{iso(self.holdout_start)}/{iso(self.last)}",
        }


@dataclass(frozen=True)
class TrainingSets:
    train: WindowSet  # pairs sensors first, then the original data's
    indices: npt.NDArray[np.int64]  # windows of one epoch (pairs repeated pairs_weight times)
    validation: WindowSet | None
    counts: dict[str, int]


def pairs_since(pairs: RecordedPairs, since: datetime) -> RecordedPairs:
    """Only the pairs from ``since`` on (e.g. the start of a drift); the rest counted as dropped."""
    start = (since if since.tzinfo is not None else since.replace(tzinfo=UTC)).timestamp()
    frame = pairs.data.frame
    keep = unix_seconds(frame["timestamp"]) >= start
    if not keep.any():
        raise HoldoutError(
            f"no pair in {pairs.directory} starts at or after {iso(start)} (the last starts at "
            f"{iso(float(unix_seconds(frame['timestamp']).max()))})"
        )
    counts = pairs.data.load_counts
    dropped = dict(counts.rows_dropped) if counts is not None else {}
    dropped[BEFORE_SINCE] = int((~keep).sum())
    data = dataclasses.replace(
        pairs.data,
        frame=frame.loc[keep].reset_index(drop=True),
        load_counts=LoadCounts(
            rows_read=counts.rows_read if counts is not None else len(frame),
            rows_dropped=dropped,
        ),
    )
    recorded = pairs.recorded
    recorded = recorded.loc[unix_seconds(recorded["timestamp"]) >= start].reset_index(drop=True)
    return dataclasses.replace(pairs, data=data, recorded=recorded)


def split_periods(
    cleaned: CoLocationData, holdout: HoldBack, validation_fraction: float
) -> Periods:
    """Validation and held-back boundaries over the periods that have a reference."""
    frame = cleaned.frame
    seconds = unix_seconds(frame["timestamp"])
    with_reference = np.unique(seconds[np.isfinite(frame["reference"].to_numpy())])
    if with_reference.size == 0:
        raise HoldoutError("no pair has a valid reference after cleaning")
    first, last = float(with_reference[0]), float(with_reference[-1])
    if holdout.kind == "duration":
        holdout_start = last + cleaned.period_seconds - holdout.value
    else:
        position = math.floor((1.0 - holdout.value) * with_reference.size)
        holdout_start = float(with_reference[min(position, with_reference.size - 1)])
    before = with_reference[with_reference < holdout_start]
    if before.size == 0:
        raise HoldoutError(
            f"every recorded period ({iso(first)} to {iso(last)}) falls in the held-back "
            f"period ({holdout.describe()}): hold back less or record longer"
        )
    validation_start = holdout_start
    if validation_fraction > 0:
        position = math.floor((1.0 - validation_fraction) * before.size)
        validation_start = float(before[min(position, before.size - 1)])
    return Periods(
        validation_start=validation_start, holdout_start=holdout_start, first=first, last=last
    )


def masked(sensors: Any, start: float, end: float) -> list[GriddedSensor]:
    """The sensors with their reference kept only in ``[start, end)`` (inputs untouched)."""
    masked = []
    for sensor in sensors:
        stamps = sensor.timestamps
        keep = (stamps >= start) & (stamps < end)
        masked.append(
            dataclasses.replace(sensor, reference=np.where(keep, sensor.reference, np.nan))
        )
    return masked


def only_references_from(data: CoLocationData, start: float) -> CoLocationData:
    """The data with references before ``start`` removed: inputs stay for the windows' history."""
    frame = data.frame
    keep = unix_seconds(frame["timestamp"]) >= start
    return data.with_frame(frame.assign(reference=frame["reference"].where(keep)))


def training_sets(
    sensors: dict[str, GriddedSensor],
    original: CoLocationData | None,
    periods: Periods,
    shape: tuple[int, GapPolicy, tuple[str, ...]],
    *,
    min_train_windows: int,
    pairs_weight: int = 1,
    max_original_windows: int | None = None,
    seed: int = 0,
) -> TrainingSets:
    """Pairs windows before the validation period (+ original data), and validation windows."""
    window_length, policy, channels = shape
    pairs_train = masked(sensors.values(), -math.inf, periods.validation_start)
    pairs_count = len(WindowSet.build(pairs_train, window_length, policy, channels))
    if pairs_count < min_train_windows:
        raise HoldoutError(
            f"only {pairs_count} training window(s) of N={window_length} in the pairs before "
            f"the validation and held-back periods ({periods.as_json()['training']}); at least "
            f"{min_train_windows} are needed: record longer or hold back less"
        )
    original_sensors = (
        [
            dataclasses.replace(sensor, sensor_id=f"original/{sensor.sensor_id}")
            for sensor in to_grid(original).values()
        ]
        if original is not None
        else []
    )
    # Pairs sensors first, so the first pairs_count windows are the pairs' windows.
    train = WindowSet.build([*pairs_train, *original_sensors], window_length, policy, channels)
    indices = np.arange(len(train), dtype=np.int64)
    pairs_indices = np.repeat(indices[:pairs_count], pairs_weight)
    original_indices = indices[pairs_count:]
    cap = max_original_windows
    if cap is not None and original_indices.size > cap:
        rng = np.random.default_rng(seed)
        original_indices = np.sort(rng.choice(original_indices, cap, replace=False))
    validation: WindowSet | None = None
    if periods.validation_start < periods.holdout_start:
        validation = WindowSet.build(
            masked(sensors.values(), periods.validation_start, periods.holdout_start),
            window_length,
            policy,
            channels,
        )
        if len(validation) == 0:
            raise HoldoutError(
                f"no window with a reference in the validation period "
                f"({periods.as_json()['validation']}); record longer, raise "
                "validation_fraction, or set it to 0 to train without early stopping"
            )
    return TrainingSets(
        train=train,
        indices=np.concatenate([pairs_indices, original_indices]),
        validation=validation,
        counts={
            "train_pairs": pairs_count,
            "train_original": int(original_indices.size),
            "validation": len(validation) if validation is not None else 0,
        },
    )


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def duration_text(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"

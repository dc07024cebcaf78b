"""What came back from the gateway, joined with the station reference, and the running errors.

Errors of the raw and the calibrated values are computed over the same periods (those with a
calibration and a reference), so the two numbers compare like with like.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime

from devkit.demo.replay_slice import DemoSlice, SliceRow

__all__ = ["Output", "Scoreboard", "SensorScore"]


@dataclass(frozen=True, slots=True)
class Output:
    """One calibrated message: one sensor, one period."""

    period_start: float
    raw: float | None
    calibrated: float | None
    reference: float
    quality: tuple[str, ...]
    model: str | None = None  # the model that calibrated it (several serve pm10: channels)
    low: float | None = None  # the published prediction interval, when there is one
    high: float | None = None
    history_periods: int | None = None  # periods of history the window had (N: whole)


@dataclass(slots=True)
class SensorScore:
    """Everything the live view and the summary show for one sensor."""

    sensor_id: str
    link: str
    sent: int = 0
    last_sent: SliceRow | None = None
    outputs: dict[float, Output] = field(default_factory=dict)
    duplicates: int = 0
    warming_up: int = 0
    gap: int = 0
    calibrated: int = 0
    scored: int = 0  # calibrated periods with a reference
    _raw_sq: float = 0.0
    _cal_sq: float = 0.0
    _raw_abs: float = 0.0
    _cal_abs: float = 0.0
    latest: Output | None = None
    models: dict[str, int] = field(default_factory=dict)  # calibrated periods per model

    def add(self, output: Output) -> None:
        if output.period_start in self.outputs:
            self.duplicates += 1  # at-least-once delivery: the first copy counts
            return
        self.outputs[output.period_start] = output
        if self.latest is None or output.period_start > self.latest.period_start:
            self.latest = output
        if "warming_up" in output.quality:
            self.warming_up += 1
        if "gap" in output.quality:
            self.gap += 1
        if output.calibrated is None:
            return
        self.calibrated += 1
        if output.model is not None:
            self.models[output.model] = self.models.get(output.model, 0) + 1
        if output.raw is None or not math.isfinite(output.reference):
            return
        self.scored += 1
        raw_error = output.raw - output.reference
        cal_error = output.calibrated - output.reference
        self._raw_sq += raw_error * raw_error
        self._cal_sq += cal_error * cal_error
        self._raw_abs += abs(raw_error)
        self._cal_abs += abs(cal_error)

    @property
    def model(self) -> str:
        """The model that calibrated most of its periods ('—' before any)."""
        return max(self.models, key=self.models.__getitem__) if self.models else "—"

    @property
    def rmse_raw(self) -> float:
        return math.sqrt(self._raw_sq / self.scored) if self.scored else math.nan

    @property
    def rmse_calibrated(self) -> float:
        return math.sqrt(self._cal_sq / self.scored) if self.scored else math.nan

    @property
    def mae_raw(self) -> float:
        return self._raw_abs / self.scored if self.scored else math.nan

    @property
    def mae_calibrated(self) -> float:
        return self._cal_abs / self.scored if self.scored else math.nan


class Scoreboard:
    """All sensors; fed by the nodes (what was sent) and the subscriber (what came back)."""

    def __init__(self, demo_slice: DemoSlice, links: dict[str, str]) -> None:
        self._reference = {sensor: demo_slice.reference(sensor) for sensor in links}
        self.sensors = {sensor: SensorScore(sensor, link) for sensor, link in sorted(links.items())}
        self.malformed = 0

    def on_sent(self, sensor_id: str, row: SliceRow) -> None:
        score = self.sensors[sensor_id]
        score.sent += 1
        score.last_sent = row

    def on_message(self, topic: str, payload: bytes) -> None:
        """A message on ``tesla/<gateway>/<sensor>/pm10``."""
        parts = topic.split("/")
        score = self.sensors.get(parts[-2]) if len(parts) >= 2 else None
        if score is None:
            return
        try:
            document = json.loads(payload)
            start = datetime.fromisoformat(document["period_start"].replace("Z", "+00:00"))
            output = Output(
                period_start=start.timestamp(),
                raw=_optional(document["raw"]),
                calibrated=_optional(document["calibrated"]),
                reference=self._reference[score.sensor_id].get(start.timestamp(), math.nan),
                quality=tuple(str(flag) for flag in document["quality"]),
                model=None if document.get("model") is None else str(document["model"]),
                **_interval(document.get("interval")),
                history_periods=_optional_int(document.get("history_periods")),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            self.malformed += 1
            return
        score.add(output)

    @property
    def complete(self) -> bool:
        """Every period sent so far has come back."""
        return all(len(score.outputs) >= score.sent for score in self.sensors.values())


def _interval(interval: object) -> dict[str, float | None]:
    """``low``/``high`` of a published interval (both None without one)."""
    if not isinstance(interval, dict):
        return {"low": None, "high": None}
    return {"low": _optional(interval.get("low")), "high": _optional(interval.get("high"))}


def _optional_int(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r}")
    return value


def _optional(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r}")
    return float(value)

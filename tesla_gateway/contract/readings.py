"""The validated reading every source produces, and the reasons a reading can be rejected.

Sources parse their wire format into :class:`Reading` through :func:`validate_reading`, so one set
of rules decides what is accepted no matter how a reading arrived. Rejects are counted by
:class:`RejectReason`, never raised past the source: bad input must not stop the daemon.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Literal

from tesla_gateway.errors import GatewayError

__all__ = [
    "COVARIATES",
    "FIELD_LIMITS",
    "GATEWAY_ID_PATTERN",
    "SENSOR_ID_PATTERN",
    "SEQ_MAX",
    "Covariate",
    "Feature",
    "Reading",
    "ReadingRejectedError",
    "RejectReason",
    "covariate_fault",
    "validate_reading",
]

SENSOR_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# A gateway's name goes into topics, client ids and logs: the same characters as a sensor id.
GATEWAY_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# The particle fractions a model calibrates (one model per feature) ...
Feature = Literal["pm10", "pm2_5", "pm1"]
# ... and the covariates a reading may carry beside them, which a model may take as inputs.
Covariate = Literal["rh", "temp_c"]
COVARIATES: tuple[Covariate, ...] = ("rh", "temp_c")
SEQ_MAX = 2**32 - 1  # a node's per-reading sequence number is a uint32 (wraps)
_KEPT = ", the reading kept"

# Physically possible values per field; outside them a reading is a fault, not weather.
# PMS5003: effective range 0-500 µg/m³, maximum 1000 (datasheet); RH in %; temperature in degC.
FIELD_LIMITS: Mapping[str, tuple[float, float]] = MappingProxyType(
    {
        "pm1": (0.0, 1000.0),
        "pm2_5": (0.0, 1000.0),
        "pm10": (0.0, 1000.0),
        "rh": (0.0, 100.0),
        "temp_c": (-40.0, 85.0),
    }
)


class RejectReason(enum.StrEnum):
    """Why an input was not accepted; the stats topic counts each separately."""

    TOO_LARGE = "too_large"
    BAD_ENCODING = "bad_encoding"
    BAD_JSON = "bad_json"
    SCHEMA = "schema"
    BAD_SENSOR_ID = "bad_sensor_id"
    UNKNOWN_SENSOR = "unknown_sensor"
    UNKNOWN_FIELD = "unknown_field"
    NO_VALUES = "no_values"
    NOT_FINITE = "not_finite"
    NEGATIVE = "negative"
    OUT_OF_RANGE = "out_of_range"
    FUTURE_TIMESTAMP = "future_timestamp"
    STALE_TIMESTAMP = "stale_timestamp"
    BAD_CHECKSUM = "bad_checksum"
    BAD_FRAME = "bad_frame"
    SENSOR_NOT_OWNED = "sensor_not_owned"  # a serial node reporting for an id it did not announce
    LATE = "late"  # its period was already closed in a window (out of order, or after a restart)
    CLOCK_OUTLIER = "clock_outlier"  # ahead of the gateway clock, contradicted by the next one
    CHANNEL_DISAGREEMENT = "channel_disagreement"  # a dual-laser unit's A and B disagree
    # a covariate (rh, temp_c) out of range, not finite or not a number: it is dropped and the
    # reading kept (its PM still calibrates, by a model that does not need the covariate)
    BAD_COVARIATE = "bad_covariate"
    # the sensor id already reports through another source (a sensor id belongs to one source)
    SENSOR_ID_CONFLICT = "sensor_id_conflict"


class ReadingRejectedError(GatewayError):
    """An input was refused; ``reason`` is what the stats count, the message what the log says."""

    def __init__(self, reason: RejectReason, detail: str, *, sensor_id: str | None = None) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.sensor_id = sensor_id  # whose input it was, when known (for the operator's log)


@dataclass(frozen=True, slots=True, init=False)
class Reading:
    """One sensor's measurements at one instant, already validated.

    Every reading is built once per arrival, so ``__init__`` is written out: a frozen
    dataclass's generated one sets each field through ``object.__setattr__``, which looks the
    name up again per field; the slots' own setters (``_SET_FIELDS``) take about a third less time
    (docs/performance.md). Fields, defaults, equality, hashing and immutability are the
    dataclass's.
    """

    sensor_id: str
    timestamp: float  # Unix seconds, UTC: the measurement's own time (event time)
    values: Mapping[str, float] = field(hash=False)
    source: str = "unknown"
    seq: int | None = (
        None  # the node's sequence number, if it sends one (tesla_gateway.ingest.sequence)
    )
    # Covariates refused while the reading was kept (reason bad_covariate): the source counts
    # each as a reject, so a dropped humidity is seen by the operator, never silent.
    dropped: tuple[ReadingRejectedError, ...] = field(default=(), hash=False, compare=False)
    # The reading carried no time of its own: ``timestamp`` is its arrival on the gateway clock,
    # so its period moves with that clock when it steps (tesla_gateway/daemon/clock_steps.py).
    stamped_at_gateway: bool = field(default=False, compare=False)

    def __init__(  # noqa: PLR0917  # the dataclass's signature: positional as before
        self,
        sensor_id: str,
        timestamp: float,
        values: Mapping[str, float],
        source: str = "unknown",
        seq: int | None = None,
        dropped: tuple[ReadingRejectedError, ...] = (),
        stamped_at_gateway: bool = False,
    ) -> None:
        set_sensor_id, set_timestamp, set_values, set_source, set_seq, set_dropped, set_stamped = (
            _SET_FIELDS
        )
        set_sensor_id(self, sensor_id)
        set_timestamp(self, timestamp)
        set_values(self, values)
        set_source(self, source)
        set_seq(self, seq)
        set_dropped(self, dropped)
        set_stamped(self, stamped_at_gateway)


# The slot setters of Reading's fields, in the order of its __init__ (which checks the count).
_SET_FIELDS: tuple[Callable[[Reading, Any], None], ...] = tuple(
    getattr(Reading, item.name).__set__ for item in fields(Reading)
)


def covariate_fault(name: str, detail: str) -> ReadingRejectedError:
    """The reject of one covariate whose reading is kept (``detail``: what was wrong)."""
    return ReadingRejectedError(RejectReason.BAD_COVARIATE, f"{detail}; {name} dropped{_KEPT}")


def validate_reading(
    sensor_id: str,
    timestamp: float,
    values: Mapping[str, float],
    *,
    now: float,
    source: str,
    max_future_s: float = 300.0,
    max_age_s: float | None = None,
    seq: int | None = None,
    dropped: Sequence[ReadingRejectedError] = (),
    stamped_at_gateway: bool | None = None,
) -> Reading:
    """Apply the acceptance rules shared by every source; raise :class:`ReadingRejectedError`
    (naming the sensor, so the reject log can say whose reading it was). A ``timestamp`` that
    is ``now`` itself is the source's stamp for a reading without a time of its own
    (:attr:`Reading.stamped_at_gateway`), unless ``stamped_at_gateway`` says otherwise (a
    source that stamps with an earlier arrival, as ESPHome's grouping does).

    A bad covariate (rh, temp_c) does not cost the reading: it is left out and its reject
    carried on :attr:`Reading.dropped`, with those the decoder found (``dropped``: a covariate
    that was not a number). A bad PM value, or nothing left, rejects the whole reading.
    """
    try:
        return _validated(
            sensor_id,
            timestamp,
            values,
            now=now,
            source=source,
            max_future_s=max_future_s,
            max_age_s=max_age_s,
            seq=seq,
            dropped=list(dropped),
            stamped_at_gateway=timestamp == now
            if stamped_at_gateway is None
            else stamped_at_gateway,
        )
    except ReadingRejectedError as exc:
        if exc.sensor_id is None and exc.reason is not RejectReason.BAD_SENSOR_ID:
            exc.sensor_id = sensor_id
        raise


def _validated(
    sensor_id: str,
    timestamp: float,
    values: Mapping[str, float],
    *,
    now: float,
    source: str,
    max_future_s: float,
    max_age_s: float | None,
    seq: int | None,
    dropped: list[ReadingRejectedError],
    stamped_at_gateway: bool,
) -> Reading:
    if not SENSOR_ID_PATTERN.fullmatch(sensor_id):
        raise ReadingRejectedError(
            RejectReason.BAD_SENSOR_ID,
            f"sensor id {sensor_id[:80]!r} must match {SENSOR_ID_PATTERN.pattern}",
        )
    if not math.isfinite(timestamp):
        raise ReadingRejectedError(
            RejectReason.NOT_FINITE, f"timestamp {timestamp!r} is not finite"
        )
    if timestamp > now + max_future_s:
        raise ReadingRejectedError(
            RejectReason.FUTURE_TIMESTAMP,
            f"timestamp is {timestamp - now:.0f} s in the future (limit {max_future_s:.0f} s); "
            "check the node's clock",
        )
    if max_age_s is not None and timestamp < now - max_age_s:
        raise ReadingRejectedError(
            RejectReason.STALE_TIMESTAMP,
            f"timestamp is {now - timestamp:.0f} s old (limit {max_age_s:.0f} s)",
        )
    if seq is not None and not 0 <= seq <= SEQ_MAX:
        raise ReadingRejectedError(RejectReason.SCHEMA, f"seq {seq} is not a uint32")
    if not values and not dropped:
        raise ReadingRejectedError(RejectReason.NO_VALUES, "reading carries no measurement")
    accepted: dict[str, float] = {}
    for name, raw_value in values.items():
        limits = FIELD_LIMITS.get(name)
        if limits is None:
            raise ReadingRejectedError(
                RejectReason.UNKNOWN_FIELD,
                f"field {name[:40]!r} is not one of {sorted(FIELD_LIMITS)}",
            )
        try:
            accepted[name] = _checked(name, raw_value, limits)
        except ReadingRejectedError as exc:
            if name not in COVARIATES:
                raise
            dropped.append(covariate_fault(name, exc.detail))
    if not accepted:  # only bad covariates: the reading goes, counted once for the first
        raise ReadingRejectedError(
            RejectReason.BAD_COVARIATE,
            dropped[0].detail.replace(_KEPT, " and with it the reading (no other value)"),
        )
    for fault in dropped:
        fault.sensor_id = sensor_id
    return Reading(
        sensor_id=sensor_id,
        timestamp=float(timestamp),
        values=MappingProxyType(accepted),
        source=source,
        seq=seq,
        dropped=tuple(dropped),
        stamped_at_gateway=stamped_at_gateway,
    )


def _checked(name: str, raw_value: float, limits: tuple[float, float]) -> float:
    """The value as a float inside its physical limits; raise the reason it is not."""
    try:
        value = float(raw_value)
    except (TypeError, ValueError, OverflowError) as exc:
        raise ReadingRejectedError(
            RejectReason.SCHEMA, f"{name} is not a number: {str(raw_value)[:32]!r}"
        ) from exc
    if not math.isfinite(value):
        raise ReadingRejectedError(RejectReason.NOT_FINITE, f"{name} is {value}")
    low, high = limits
    if value < 0 <= low:
        raise ReadingRejectedError(RejectReason.NEGATIVE, f"{name} is negative ({value})")
    if not low <= value <= high:
        raise ReadingRejectedError(
            RejectReason.OUT_OF_RANGE, f"{name}={value} outside [{low}, {high}]"
        )
    return value

"""Readings polled from PurpleAir units on the LAN: their local ``/json`` document.

A PurpleAir PA-II answers ``GET /json`` with one flat JSON object: ``SensorId`` (its MAC),
``DateTime`` (UTC, ``2025/05/08T20:27:22z``), ``current_temp_f`` and ``current_humidity``
(its BME280, inside the case), and the PM values of laser counter A (``pm2_5_cf_1``,
``pm2_5_atm``, ``pm10_0_cf_1``, ...) and, on a dual-laser unit, B (the same names ending in
``_b``). The fixture in tests/fixtures/fleet cites where the field list comes from.

The two counters are combined per value by one documented rule (docs/sources.md): they agree
when they differ by at most ``agree_abs_ug`` µg/m³ or by at most ``agree_rel`` of their mean
(the defaults, 5 µg/m³ and 70 %, are the US EPA's screening of PurpleAir A/B pairs, Barkjohn
et al. 2021, AMT 14, 4617); agreeing channels are averaged, disagreeing ones reject the
reading as ``channel_disagreement``. A single-laser unit (no ``_b`` fields) gives channel A.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import urlsplit

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator

from tesla_gateway.contract.readings import Reading, ReadingRejectedError, RejectReason
from tesla_gateway.contract.sensor_kind import SensorKind
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.sources.fleet_common import (
    FleetLimits,
    PmKind,
    covariate_number,
    enqueue,
    fahrenheit_to_celsius,
    json_object,
    number,
    validated,
)

if TYPE_CHECKING:
    from tesla_gateway.sources.http_io import DeviceFetcher

__all__ = ["PurpleAirSource", "PurpleAirSourceConfig", "PurpleAirUnit", "decode_purpleair"]

SOURCE_NAME = "purpleair"
_DATETIME_FORMAT = "%Y/%m/%dT%H:%M:%Sz"
# Reading channel -> the unit's field stem per PM kind (channel B appends "_b").
_PM_FIELDS: dict[str, dict[str, str]] = {
    "cf_1": {"pm1": "pm1_0_cf_1", "pm2_5": "pm2_5_cf_1", "pm10": "pm10_0_cf_1"},
    "atm": {"pm1": "pm1_0_atm", "pm2_5": "pm2_5_atm", "pm10": "pm10_0_atm"},
}


class PurpleAirUnit(BaseModel):
    """One unit to poll."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(
        pattern=r"^http://[A-Za-z0-9.:\[\]-]+(/[!-~]*)?$",
        description="The unit's local JSON, e.g. http://192.168.1.40/json.",
    )
    sensor_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$",
        description="Sensor id; default 'purpleair-' + its SensorId (MAC) without colons.",
    )

    @field_validator("url")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        parts = urlsplit(value)
        try:
            parts.port  # noqa: B018 - raises for a port outside 0-65535
        except ValueError as exc:
            raise ValueError(f"{value!r}: {exc}") from exc
        if not parts.hostname:
            raise ValueError(f"{value!r} names no host")
        return value


class PurpleAirSourceConfig(FleetLimits):
    """PurpleAir units polled over HTTP (``kind = "purpleair"``)."""

    kind: Literal["purpleair"] = Field(description="Source kind: PurpleAir local /json polling.")
    units: list[PurpleAirUnit] = Field(min_length=1, description="Units to poll.")
    poll_interval_s: float = Field(
        default=120.0, ge=0.1, le=3600, description="Seconds between polls of each unit."
    )
    timeout_s: float = Field(default=10.0, gt=0, le=120, description="Deadline of one poll.")
    pm_kind: PmKind = Field(
        default="cf_1",
        description="'cf_1': pm*_cf_1 (CF=1, PurpleAir's raw channels); 'atm': pm*_atm.",
    )
    agree_abs_ug: float = Field(
        default=5.0, ge=0, description="A and B agree when within this many µg/m³ ..."
    )
    agree_rel: float = Field(
        default=0.7, ge=0, description="... or within this fraction of their mean."
    )
    max_payload_bytes: int = Field(
        default=65_536, ge=256, le=1_048_576, description="Larger answers are refused."
    )

    def default_sensor(self) -> SensorKind:
        """A PA-II's two PMS5003s, in the value set ``pm_kind`` reads."""
        return SensorKind(model="PMS5003", values=self.pm_kind)


def decode_purpleair(
    body: bytes, *, received_at: float, sensor_id: str | None, config: PurpleAirSourceConfig
) -> Reading:
    """One ``/json`` answer into a reading; raise :class:`ReadingRejectedError` otherwise."""
    document = json_object(body, max_bytes=config.max_payload_bytes, what="answer")
    if sensor_id is None:
        mac = document.get("SensorId")
        if not isinstance(mac, str) or not mac:
            raise ReadingRejectedError(RejectReason.BAD_SENSOR_ID, "no SensorId")
        sensor_id = "purpleair-" + mac.replace(":", "").lower()
    values: dict[str, float] = {}
    for name, stem in _PM_FIELDS[config.pm_kind].items():
        if stem in document:
            values[name] = _combine(document, stem, config)
    if "pm2_5" not in values and "pm10" not in values:
        raise ReadingRejectedError(RejectReason.NO_VALUES, f"no {config.pm_kind} PM values")
    dropped: list[ReadingRejectedError] = []
    if "current_humidity" in document:
        rh = covariate_number(document["current_humidity"], "current_humidity", "rh", dropped)
        if rh is not None:
            values["rh"] = rh
    if "current_temp_f" in document:
        fahrenheit = covariate_number(
            document["current_temp_f"], "current_temp_f", "temp_c", dropped
        )
        if fahrenheit is not None:
            values["temp_c"] = fahrenheit_to_celsius(fahrenheit)
    timestamp = _timestamp(document.get("DateTime"), received_at)
    return validated(
        sensor_id,
        timestamp,
        values,
        limits=config,
        now=received_at,
        source=SOURCE_NAME,
        dropped=dropped,
    )


def _combine(document: dict[str, Any], stem: str, config: PurpleAirSourceConfig) -> float:
    a = number(document[stem], stem)
    if f"{stem}_b" not in document:
        return a
    b = number(document[f"{stem}_b"], f"{stem}_b")
    difference = abs(a - b)
    mean = (a + b) / 2.0
    if difference <= config.agree_abs_ug or difference <= config.agree_rel * abs(mean):
        return mean
    raise ReadingRejectedError(
        RejectReason.CHANNEL_DISAGREEMENT,
        f"{stem}: A={a} and B={b} differ by {difference:.1f} µg/m³ (limit {config.agree_abs_ug} "
        f"µg/m³ or {config.agree_rel:.0%} of the mean)",
    )


def _timestamp(value: object, received_at: float) -> float:
    if value is None:
        return received_at
    if not isinstance(value, str) or len(value) > 32:
        raise ReadingRejectedError(RejectReason.SCHEMA, "DateTime is not a short string")
    try:
        parsed = datetime.strptime(value.replace("Z", "z"), _DATETIME_FORMAT)
    except ValueError as exc:
        raise ReadingRejectedError(
            RejectReason.SCHEMA, f"DateTime {value!r} is not YYYY/MM/DDTHH:MM:SSz"
        ) from exc
    return parsed.replace(tzinfo=UTC).timestamp()


class PurpleAirSource:
    """Polls each unit every ``poll_interval_s`` and feeds validated readings into the queue.

    A unit that cannot be reached is logged and counted (``poll_failures``), not a reject: no
    input was refused. An answer with the same ``DateTime`` as the last one is not a new
    measurement and is skipped (``unchanged``).
    """

    def __init__(
        self, config: PurpleAirSourceConfig, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._config = config
        self._clock = clock
        self._log = structlog.get_logger("tesla_gateway.sources.purpleair")
        self._last: dict[str, float] = {}
        self._accepted = 0
        self._failures = 0
        self._unchanged = 0
        self._polled_ok: set[str] = set()

    def stats(self) -> dict[str, object]:
        return {
            "kind": SOURCE_NAME,
            "connected": len(self._polled_ok) == len(self._config.units),
            "accepted": self._accepted,
            "poll_failures": self._failures,
            "unchanged": self._unchanged,
        }

    async def run(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None:
        config = self._config
        # aiohttp is loaded when a PurpleAir source runs, not with its config model.
        from tesla_gateway.sources.http_io import DeviceFetcher

        fetcher = DeviceFetcher(timeout_s=config.timeout_s, max_bytes=config.max_payload_bytes)
        async with fetcher, asyncio.TaskGroup() as group:
            for unit in config.units:
                group.create_task(self._poll_forever(fetcher, unit, queue, rejects), name=unit.url)

    async def _poll_forever(
        self,
        fetcher: DeviceFetcher,
        unit: PurpleAirUnit,
        queue: asyncio.Queue[Reading],
        rejects: RejectCounter,
    ) -> None:
        while True:
            await enqueue(queue, await self.poll_once(fetcher, unit, rejects))
            await asyncio.sleep(self._config.poll_interval_s)

    async def poll_once(
        self, fetcher: DeviceFetcher, unit: PurpleAirUnit, rejects: RejectCounter
    ) -> list[Reading]:
        """Fetch and decode one answer; every failure is counted, none raised."""
        from tesla_gateway.sources.http_io import HttpFetchError

        config = self._config
        try:
            body = await fetcher.get(unit.url)
        except HttpFetchError as exc:
            self._failures += 1
            self._polled_ok.discard(unit.url)
            self._log.warning("purpleair_poll_failed", url=unit.url, error=str(exc))
            return []
        self._polled_ok.add(unit.url)
        try:
            reading = decode_purpleair(
                body, received_at=self._clock(), sensor_id=unit.sensor_id, config=config
            )
        except ReadingRejectedError as exc:
            rejects.reject_error(exc, source=SOURCE_NAME)
            return []
        if self._last.get(unit.url) == reading.timestamp:
            self._unchanged += 1
            return []
        self._last[unit.url] = reading.timestamp
        rejects.reject_dropped(reading, where=unit.url)
        self._accepted += 1
        return [reading]

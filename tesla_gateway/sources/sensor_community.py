"""Readings from sensor.community (airrohr) stations: the firmware's "Send to own API" POST.

The airrohr firmware (github.com/opendata-stuttgart/sensors-software,
``airrohr-firmware/airrohr-firmware.ino``) POSTs, every sending interval, to the configured
host, port and path (default ``/data.php``) a JSON object ``{"esp8266id": "<chip id>",
"software_version": "NRZ-...", "sensordatavalues": [{"value_type": ..., "value": ...}, ...]}``
with the values as strings (averages over the interval), HTTP Basic authentication when a user
or password is set, and an ``X-Sensor: esp8266-<chip id>`` header. The station sends no time:
a reading is stamped when it is received. The Nettigo Air Monitor firmware (github.com/nettigo/namf,
``src/main.cpp``, its custom-API branch) sends the same document, but names the chip id
``esp32id`` when built for an ESP32 (``esp8266id`` on an ESP8266): either names the station.
docs/sources.md gives the mapping.

The listener is an aiohttp application on one catch-all route, run by an ``AppRunner`` inside
the source's task: one request per connection, head and body bounded, a deadline for each,
connections bounded in total, per peer host and in idle time
(:mod:`tesla_gateway.connection_limits`), optional Basic credentials; a bad request is answered
with its HTTP status and counted, never raised.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import structlog
from pydantic import Field, SecretStr, model_validator

from tesla_gateway.connection_limits import ConnectionLimiter, ConnectionLimits, serve_limited
from tesla_gateway.contract.readings import Reading, ReadingRejectedError, RejectReason
from tesla_gateway.contract.sensor_kind import PMS5003_ATM, SensorKind
from tesla_gateway.ingest.ingest_log import commit_queued
from tesla_gateway.ingest.rejects import RejectCounter
from tesla_gateway.sources.fleet_common import (
    FleetLimits,
    covariate_number,
    json_object,
    number,
    validated,
)

if TYPE_CHECKING:
    from aiohttp import web

# aiohttp (about 20 MiB resident) is imported when a listener runs, not with the config models:
# a gateway without this source never loads it (tesla_gateway.sources.http_io).

__all__ = ["SensorCommunitySource", "SensorCommunitySourceConfig", "decode_sensor_community"]

SOURCE_NAME = "sensor_community"
# PM sensors the firmware names in value_type, in the order "auto" tries them. P0 is PM1,
# P1 is PM10 and P2 is PM2.5 (add_Value2Json calls in airrohr-firmware.ino).
PM_SENSORS = ("PMS", "SDS", "NPM", "SPS30", "IPS")
PmSensor = Literal["auto", "PMS", "SDS", "NPM", "SPS30", "IPS"]
_PM_SUFFIX = {"P0": "pm1", "P1": "pm10", "P2": "pm2_5"}
# What each value type prefix delivers. The firmware's PMS values are the frame's atmospheric
# ones (sensorPMS: bytes 10-15); it reads every PMSx003 alike, the PMS5003 being the common one.
_PM_SENSOR_KINDS = {
    "PMS": PMS5003_ATM,
    "SDS": SensorKind(model="SDS011"),
    "NPM": SensorKind(model="NextPM"),
    "SPS30": SensorKind(model="SPS30"),
    "IPS": SensorKind(model="IPS-7100"),
}
# Covariate value types, first present wins (BME280 before SHT3X, ..., the DHT22's plain name).
_HUMIDITY = ("BME280_humidity", "SHT3X_humidity", "HTU21D_humidity", "humidity", "SCD30_humidity")
_TEMPERATURE = (
    "BME280_temperature",
    "SHT3X_temperature",
    "HTU21D_temperature",
    "temperature",
    "BMP280_temperature",
    "SCD30_temperature",
    "DS18B20_temperature",
)
_MAX_VALUES = 64
# The station's chip id: airrohr and NAM on an ESP8266 send esp8266id, NAM on an ESP32 esp32id.
_CHIP_ID_KEYS = ("esp8266id", "esp32id")
# The request head: its request line and each header line at most 8 KiB, at most 32 headers
# (the firmware sends about ten). aiohttp answers a longer or larger head 400 itself.
_MAX_HEAD_LINE_BYTES = 8_192
_MAX_HEADERS = 32
_MAX_LISTEN_RETRY_S = 30.0
# Connections open at once, per max_connections: those being handled, and as many again waiting
# for a slot or being answered 503.
_OPEN_PER_REQUEST_SLOT = 2
# A connection without a byte either way for this many request_timeout_s is cut: past both the
# head's and the body's deadline, e.g. a client that stopped reading its answer.
_IDLE_TIMEOUTS = 2
# How long cancellation waits for requests already being answered before cutting them.
_SHUTDOWN_GRACE_S = 1.0


class SensorCommunitySourceConfig(FleetLimits):
    """An HTTP listener for airrohr stations' "Send to own API" (``kind = "sensor_community"``)."""

    kind: Literal["sensor_community"] = Field(
        description="Source kind: sensor.community (airrohr) firmware HTTP POST."
    )
    host: str = Field(
        default="0.0.0.0",  # noqa: S104 - the stations are on the LAN; restrict with host
        description="Address to listen on (the stations post to this host's LAN address).",
    )
    port: int = Field(default=8000, ge=1, le=65_535, description="TCP port to listen on.")
    path: str = Field(
        default="/data.php",
        pattern=r"^/[A-Za-z0-9_./-]{0,127}$",
        description="Path the stations post to (the firmware's default is /data.php).",
    )
    username: str | None = Field(
        default=None, max_length=64, description="Basic auth user the stations send, if any."
    )
    password: SecretStr | None = Field(
        default=None, description="Basic auth password the stations send, if any."
    )
    pm_sensor: PmSensor = Field(
        default="auto",
        description="PM sensor whose values to take; auto: the first of PMS, SDS, NPM, SPS30, IPS.",
    )
    sensor_id_prefix: str = Field(
        default="airrohr-",
        max_length=32,
        pattern=r"^[A-Za-z0-9_.-]*$",
        description="Sensor id = prefix + the station's esp8266id (or esp32id).",
    )
    request_timeout_s: float = Field(
        default=10.0,
        gt=0,
        le=120,
        description="Deadline for the request head from connecting, then again for the body.",
    )
    max_connections: int = Field(
        default=32,
        ge=1,
        le=1024,
        description=(
            "Most requests handled at once; more are answered 503. Connections beyond twice "
            "this many are closed as soon as they are accepted."
        ),
    )
    max_connections_per_host: int = Field(
        default=4,
        ge=1,
        le=1024,
        description=(
            "Most connections open at once from one address (a station sends one request per "
            "interval), so that one host cannot keep the stations out."
        ),
    )

    def default_sensor(self) -> SensorKind | None:
        """``pm_sensor``'s sensor; ``auto`` takes whichever a station has, so it is not known."""
        return None if self.pm_sensor == "auto" else _PM_SENSOR_KINDS[self.pm_sensor]

    @model_validator(mode="after")
    def _auth_pair(self) -> SensorCommunitySourceConfig:
        if (self.username is None) != (self.password is None):
            raise ValueError("set both username and password for Basic auth, or neither")
        return self


def decode_sensor_community(
    body: bytes, *, received_at: float, config: SensorCommunitySourceConfig
) -> Reading:
    """One POSTed document into a reading; raise :class:`ReadingRejectedError` otherwise."""
    document = json_object(body, max_bytes=config.max_payload_bytes, what="body")
    chip = next((document[key] for key in _CHIP_ID_KEYS if key in document), None)
    if isinstance(chip, int) and not isinstance(chip, bool):
        chip = str(chip)
    if not isinstance(chip, str) or not chip:
        raise ReadingRejectedError(RejectReason.BAD_SENSOR_ID, "no esp8266id or esp32id")
    by_type = _values_by_type(document.get("sensordatavalues"))
    values = _pm_values(by_type, config.pm_sensor)
    dropped: list[ReadingRejectedError] = []
    for name, candidates in (("rh", _HUMIDITY), ("temp_c", _TEMPERATURE)):
        for value_type in candidates:
            if value_type in by_type:
                value = covariate_number(by_type[value_type], value_type, name, dropped)
                if value is not None:
                    values[name] = value
                break
    return validated(
        chip,
        received_at,
        values,
        limits=config,
        now=received_at,
        source=SOURCE_NAME,
        dropped=dropped,
    )


def _values_by_type(items: object) -> dict[str, Any]:
    if not isinstance(items, list):
        raise ReadingRejectedError(RejectReason.SCHEMA, "sensordatavalues is not a list")
    if len(items) > _MAX_VALUES:
        raise ReadingRejectedError(RejectReason.TOO_LARGE, f"{len(items)} sensordatavalues")
    by_type: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("value_type"), str):
            raise ReadingRejectedError(
                RejectReason.SCHEMA, "a sensordatavalues item lacks a string value_type"
            )
        by_type[item["value_type"]] = item.get("value")
    return by_type


def _pm_values(by_type: dict[str, Any], choice: PmSensor) -> dict[str, float]:
    sensors = PM_SENSORS if choice == "auto" else (choice,)
    for sensor in sensors:
        values = {
            name: number(by_type[f"{sensor}_{suffix}"], f"{sensor}_{suffix}")
            for suffix, name in _PM_SUFFIX.items()
            if f"{sensor}_{suffix}" in by_type
        }
        if "pm2_5" in values or "pm10" in values:
            return values
    raise ReadingRejectedError(
        RejectReason.NO_VALUES, f"no PM2.5 or PM10 value of {'/'.join(sensors)}"
    )


class SensorCommunitySource:
    """Listens for the stations' POSTs and feeds validated readings into the queue."""

    def __init__(
        self, config: SensorCommunitySourceConfig, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._config = config
        self._clock = clock
        self._log = structlog.get_logger("tesla_gateway.sources.sensor_community")
        self._listening = asyncio.Event()
        self._accepted = 0
        self._refused: dict[int, int] = {}
        self._slots = asyncio.Semaphore(config.max_connections)
        self._limiter = ConnectionLimiter(
            SOURCE_NAME,
            ConnectionLimits(
                max_total=_OPEN_PER_REQUEST_SLOT * config.max_connections,
                max_per_host=config.max_connections_per_host,
                idle_timeout_s=_IDLE_TIMEOUTS * config.request_timeout_s,
            ),
        )

    def stats(self) -> dict[str, object]:
        return {
            "kind": SOURCE_NAME,
            "connected": self._listening.is_set(),
            "accepted": self._accepted,
            "http_refused": {str(code): n for code, n in sorted(self._refused.items())},
            "connections": self._limiter.stats(),
        }

    async def wait_listening(self) -> None:
        """Return once the listener accepts connections (tests and start-up ordering)."""
        await self._listening.wait()

    async def run(self, queue: asyncio.Queue[Reading], rejects: RejectCounter) -> None:
        """Listen until cancelled, then close the socket and every open connection."""
        from aiohttp import web

        from tesla_gateway.sources.http_io import server_logger

        config = self._config

        async def handle(request: web.Request) -> web.Response:
            if self._slots.locked():
                return self._answer(503, "busy")
            async with self._slots:
                status, text = await self._serve(request, queue, rejects)
            return self._answer(status, text)

        app = web.Application(client_max_size=config.max_payload_bytes)
        app.router.add_route("*", "/{path:.*}", handle)
        runner = web.AppRunner(
            app,
            access_log=None,
            logger=server_logger("tesla_gateway.sources.sensor_community.http"),
            shutdown_timeout=_SHUTDOWN_GRACE_S,
            # A connection that has not sent a whole request head by then is closed.
            keepalive_timeout=config.request_timeout_s,
            # An answer closes the connection at once; an unread body is not drained.
            lingering_time=0,
            max_line_size=_MAX_HEAD_LINE_BYTES,
            max_field_size=_MAX_HEAD_LINE_BYTES,
            max_headers=_MAX_HEADERS,
        )
        await runner.setup()
        server: asyncio.Server | None = None
        try:
            server = await self._listen(runner)
            self._listening.set()
            self._log.info("sensor_community_listening", host=config.host, port=config.port)
            await asyncio.Event().wait()
        finally:
            self._listening.clear()
            if server is not None:
                server.close()  # no new connections; the cleanup closes the open ones
            await runner.cleanup()

    async def _listen(self, runner: web.AppRunner) -> asyncio.Server:
        """Bind, retrying with backoff: a taken port must not take the other sources down."""
        delay = 1.0
        while True:
            try:
                return await serve_limited(
                    runner, self._config.host, self._config.port, self._limiter
                )
            except OSError as exc:
                self._log.error(
                    "sensor_community_listen_failed",
                    host=self._config.host,
                    port=self._config.port,
                    error=str(exc),
                    retry_in_s=delay,
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, _MAX_LISTEN_RETRY_S)

    def _answer(self, status: int, text: str) -> web.Response:
        from tesla_gateway.sources.http_io import text_response

        if status != 200:
            self._refused[status] = self._refused.get(status, 0) + 1
        return text_response(status, text)

    def _refusal(self, request: web.Request) -> tuple[int, str] | None:
        """Why a request is refused from its head (path, method, credentials), or None."""
        from tesla_gateway.sources.http_io import basic_auth_matches

        config = self._config
        if request.path != config.path:
            return 404, f"post to {config.path}"
        if request.method != "POST":
            return 405, "POST only"
        if config.username is not None and config.password is not None:
            password = config.password.get_secret_value()
            header = request.headers.get("Authorization")
            if not basic_auth_matches(header, config.username, password):
                return 401, "wrong or missing credentials"
        return None

    async def _serve(
        self,
        request: web.Request,
        queue: asyncio.Queue[Reading],
        rejects: RejectCounter,
    ) -> tuple[int, str]:
        """Check the head, read the body, decode and queue: the status and text to answer."""
        from tesla_gateway.sources.http_io import HttpRequestError, read_body

        config = self._config
        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        try:
            body = await read_body(
                request, max_bytes=config.max_payload_bytes, timeout_s=config.request_timeout_s
            )
        except HttpRequestError as exc:
            if exc.status == 413:
                rejects.reject(RejectReason.TOO_LARGE, source=SOURCE_NAME, detail=exc.detail)
            return exc.status, exc.detail
        try:
            reading = decode_sensor_community(body, received_at=self._clock(), config=config)
        except ReadingRejectedError as exc:
            rejects.reject_error(exc, source=SOURCE_NAME)
            return 400, exc.reason.value
        rejects.reject_dropped(reading)
        await queue.put(reading)
        commit_queued(queue)  # in the ingest log before the station hears OK
        self._accepted += 1
        return 200, "OK"

"""The hour of the day as model input channels: the rule training and the gateway share.

A PM sensor's bias follows the day (humid nights, traffic hours), and a sensor that has reported
for one period has nothing else to tell a model about it. A model may therefore read two derived
channels, ``hour_sin`` and ``hour_cos``: the phase of the period's start in the local *standard*
time of where the sensor is (UTC plus the zone's standard offset, daylight saving time ignored,
because the sun and the humidity follow it, not the clocks). No sensor sends them: training
computes them from each period's start and its site's offset, the gateway from the period and
its configured zone, a node from the time the gateway gives it.

A period whose hour is not known (a node without a clock) takes :data:`UNKNOWN_HOUR`, the
centre of the circle, which is no hour at all; models that read the hour are trained with some
windows set to it, so they fall back to what the PM channels alone say.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import numpy as np
import numpy.typing as npt

__all__ = [
    "DAY_SECONDS",
    "HOUR_CHANNELS",
    "RULES_FROM_S",
    "UNKNOWN_HOUR",
    "hour_channels",
    "hour_phase",
    "is_hour_channel",
    "neutral_hours",
    "standard_offset_seconds",
    "system_zone",
    "utc_offset_for",
    "window_hours",
    "zone_problem",
]

DAY_SECONDS = 86_400
HOUR_CHANNELS: tuple[str, str] = ("hour_sin", "hour_cos")
UNKNOWN_HOUR: tuple[float, float] = (0.0, 0.0)
# A gateway clock before this (2023-11-14) has not been set: zones take their rules from here.
RULES_FROM_S = 1_700_000_000
# The offsets of real zones; a larger one is a configuration error, not a place.
_MAX_OFFSET_SECONDS = 14 * 3600


def is_hour_channel(name: str) -> bool:
    """Whether a manifest channel is derived from the period's time rather than read."""
    return name in HOUR_CHANNELS


def neutral_hours(windows: npt.NDArray[np.float32], channels: tuple[str, ...]) -> None:
    """Set the hour channels of made-up [B, N, C] windows (a load's test invoke, a release's
    constant check windows) to :data:`UNKNOWN_HOUR`, in place: a PM level is no hour."""
    if windows.ndim != 3:
        return
    for position, name in enumerate(channels):
        if is_hour_channel(name):
            windows[:, :, position] = 0.0


def _check_offset(utc_offset_s: int) -> None:
    if not -_MAX_OFFSET_SECONDS <= utc_offset_s <= _MAX_OFFSET_SECONDS:
        raise ValueError(f"UTC offset {utc_offset_s} s is not a zone's (at most ±14 h)")


def hour_phase(period_start_s: float, utc_offset_s: int) -> tuple[float, float]:
    """(sin, cos) of the local standard time of day at ``period_start_s`` (Unix seconds)."""
    _check_offset(utc_offset_s)
    seconds_of_day = (period_start_s + utc_offset_s) % DAY_SECONDS
    angle = 2.0 * math.pi * seconds_of_day / DAY_SECONDS
    return math.sin(angle), math.cos(angle)


def hour_channels(
    period_start_s: npt.ArrayLike, utc_offset_s: int
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """:func:`hour_phase` over an array of period starts (training's whole series)."""
    _check_offset(utc_offset_s)
    starts = np.asarray(period_start_s, dtype=np.float64)
    angle = 2.0 * np.pi * np.mod(starts + utc_offset_s, DAY_SECONDS) / DAY_SECONDS
    return np.sin(angle), np.cos(angle)


def window_hours(
    pm: npt.NDArray[np.floating[Any]],
    newest_period: npt.ArrayLike,
    period_seconds: int,
    utc_offset_s: int | None,
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
    """The hour channels of windows [B, N] (oldest first) ending at ``newest_period`` [B].

    THE rule for building a window (training, gateway and node alike): each position whose PM
    value ``pm`` is present (observed or gap-filled) holds the hour of its period's start; the
    others are NaN like the PM. A young window is padded *after* this, every channel alike, so
    its padded positions repeat its oldest real period's hour as they repeat its PM. With
    ``utc_offset_s`` None (the hour is not known) every present position holds
    :data:`UNKNOWN_HOUR`.
    """
    pm = np.asarray(pm)
    present = ~np.isnan(pm)
    if utc_offset_s is None:
        zeros = np.where(present, np.float32(0.0), np.float32(np.nan)).astype(np.float32)
        return zeros, zeros.copy()
    _check_offset(utc_offset_s)
    newest = np.asarray(newest_period, dtype=np.int64).reshape(-1)
    n = pm.shape[-1]
    # Windows of one tick mostly end at the same period: compute each distinct end once.
    ends, inverse = np.unique(newest, return_inverse=True)
    starts = (ends[:, None] - (n - 1) + np.arange(n)[None, :]) * period_seconds
    sin, cos = hour_channels(starts, utc_offset_s)
    nan = np.float32(np.nan)
    return (
        np.where(present, sin[inverse].astype(np.float32), nan),
        np.where(present, cos[inverse].astype(np.float32), nan),
    )


def standard_offset_seconds(zone: str, at_s: float) -> int:
    """The standard UTC offset of an IANA zone in the year of a moment: its smaller offset
    that year (its winter time), in whole seconds.

    Not ``utcoffset - dst``: tzdata calls Irish summer time standard and winter a negative
    DST, and Python infers some zones' DST amounts wrongly (America/Inuvik: 2 h), so that
    difference moves with the seasons in some zones, which this rule exists to avoid. A zone
    that changed its standard offset within a year takes the smaller for that whole year.
    Raises ``zoneinfo.ZoneInfoNotFoundError`` (a ``KeyError``) for an unknown zone name.
    """
    return _smallest_offset(zone, datetime.fromtimestamp(at_s, tz=UTC).year)


@functools.lru_cache(maxsize=256)
def _smallest_offset(zone: str, year: int) -> int:
    info = ZoneInfo(zone)
    samples = (
        datetime(year, month, day, 12, tzinfo=UTC) for month in range(1, 13) for day in (1, 16)
    )
    return min(
        int((moment.astimezone(info).utcoffset() or timedelta(0)).total_seconds())
        for moment in samples
    )


@functools.lru_cache(maxsize=16)
def _smallest_local_offset(year: int) -> int:
    """:func:`_smallest_offset` of the C library's zone, when no IANA name can be found."""
    return min(
        time.localtime(datetime(year, month, day, 12, tzinfo=UTC).timestamp()).tm_gmtoff
        for month in range(1, 13)
        for day in (1, 16)
    )


def zone_problem(zone: str) -> str | None:
    """Why ``zone`` is not an IANA zone this machine knows, or None."""
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError):
        return (
            f"timezone {zone!r} is not an IANA time zone this machine knows (e.g. "
            "'Europe/Rome', 'America/New_York', 'UTC'; `timedatectl list-timezones`)"
        )
    return None


def utc_offset_for(zone: str | None, at_s: float) -> int:
    """The standard offset the gateway's hour channels use: the configured zone's, else the
    system's (:func:`system_zone`, what a Pi's ``timedatectl set-timezone`` sets), by the same
    rule either way. A clock before :data:`RULES_FROM_S` is taken as unset (a Pi before NTP
    answers): today's rules apply, not those of 1970."""
    at_s = max(at_s, RULES_FROM_S)
    zone = zone or system_zone()
    if zone is None:
        return _smallest_local_offset(datetime.fromtimestamp(at_s, tz=UTC).year)
    return standard_offset_seconds(zone, at_s)


def system_zone() -> str | None:
    """The IANA name of this machine's zone (``TZ``, /etc/timezone or the /etc/localtime
    link, as Debian and Raspberry Pi OS keep it), or None when it has none that names one."""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    with contextlib.suppress(OSError):
        candidates.append(Path("/etc/timezone").read_text(encoding="utf-8").strip())
    try:
        link = str(Path("/etc/localtime").readlink())
    except OSError:
        link = ""
    if "zoneinfo/" in link:
        candidates.append(link.split("zoneinfo/", 1)[1])
    return next((c for c in candidates if c and zone_problem(c) is None), None)

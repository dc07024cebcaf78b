"""Per (sensor, feature) health signals that need no reference (pure: no I/O, no clock).

The ticker already reduces every closed period to one :class:`CalibratedReading` (the period's
raw mean and the window's quality flags). :class:`SensorHealth` folds those into a few signals
in O(1) per period, with no per-reading work:

* **stuck**: the same raw period mean for ``stuck_periods`` periods in a row (the ticker
  withholds such a window's calibrated value by the same number: quality ``stuck``), or the
  newest period withheld as ``stuck`` (the windows' run, which a restart keeps and this
  in-memory count does not: health never says a sensor is fine while its value is withheld);
* **dropouts**: share of the recent ``window_periods`` grid periods without a reading;
* **spikes**: share of recent periods whose jump from the previous period exceeds a robust bound,
  ``max(spike_factor * scale, spike_min_jump)``, where ``scale`` is the median absolute jump of
  the first periods and then an exponentially weighted mean of jumps *clipped at the bound*
  (a Huber-type estimate: a spike cannot inflate the bound that detects it);
* **gap rejects**: share of recent windows the gap policy rejected (quality ``gap``);
* **domain**: share of recent periods above the training inputs' p99, above their max, below
  their p01 (from the manifest's :class:`InputRange`), and the normalised distance of the recent
  (exponentially weighted) mean from ``[p01, p99]``;
* **missing channel**: the latest window lacked an input channel the model needs;
* **implausible**: share of recent periods whose calibrated value the ticker withheld as
  implausible (tesla_gateway/models/plausibility.py); one such period in the window raises the
  flag, since it means the model computes nonsense for this sensor's inputs;
* **offline**: no closed period for ``offline_after_s`` seconds (wall clock, judged at report
  time, so replayed old data does not count as offline).

Recent-window shares live in a ring of ``window_periods`` bit sets, so advancing one period is a
constant number of integer updates (a gap of ``g`` periods costs ``min(g, window_periods)``).
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.contract.manifest import InputRange
from tesla_gateway.contract.stuck import STUCK_PERIODS, next_run

__all__ = ["HealthConfig", "HealthFlag", "HealthReport", "SensorHealth"]

# Bits of one period's slot in the recent-window ring.
_OBSERVED = 0
_SPIKE = 1
_GAP = 2
_ABOVE_P99 = 3
_ABOVE_MAX = 4
_BELOW_P01 = 5
_IMPLAUSIBLE = 6
_BITS = 7


class HealthConfig(BaseModel):
    """``[health]``: thresholds of the reference-free health signals (docs/mqtt.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        default=True, description="Track and publish per-sensor health on <prefix>/<s>/<f>/health."
    )
    publish_interval_s: float = Field(
        default=60.0,
        gt=0,
        description=(
            "Health of sensors with new periods is published this often; a flag change is "
            "published at once (at most once per closed period)."
        ),
    )
    window_periods: int = Field(
        default=60, ge=2, le=100_000, description="Recent window (grid periods) of the shares."
    )
    min_periods: int = Field(
        default=10,
        ge=1,
        description="Observed periods needed in the window before share-based flags are raised.",
    )
    stuck_periods: int = Field(
        default=STUCK_PERIODS,
        ge=2,
        description=(
            "Identical raw period means in a row that flag 'stuck' (health), and that withhold "
            "the calibrated value (quality 'stuck') while withhold_stuck is on."
        ),
    )
    withhold_stuck: bool = Field(
        default=True,
        description=(
            "Withhold the calibrated value of a sensor stuck for stuck_periods periods; turn off "
            "only for air so clean that a sensor reads exactly 0 that long."
        ),
    )
    max_dropout_fraction: float = Field(
        default=0.2, ge=0, le=1, description="'dropouts' above this share of missing periods."
    )
    spike_factor: float = Field(
        default=6.0, gt=0, description="A jump beyond this many times the robust scale is a spike."
    )
    spike_min_jump: float = Field(
        default=5.0, ge=0, description="Jumps up to this size (µg/m³) are never spikes."
    )
    max_spike_fraction: float = Field(
        default=0.05, ge=0, le=1, description="'spikes' above this share of spiking periods."
    )
    max_gap_fraction: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="'gap_rejects' above this share of windows rejected by the gap policy.",
    )
    max_above_p99_fraction: float = Field(
        default=0.2,
        ge=0,
        le=1,
        description="'out_of_domain' above this share of periods over the training p99 (1%).",
    )
    max_above_max_fraction: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="'out_of_domain' above this share of periods over the training maximum.",
    )
    max_below_p01_fraction: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="'out_of_domain' above this share of periods under the training p01 (1%).",
    )
    offline_after_s: float = Field(
        default=600.0, gt=0, description="'offline' after this long without a closed period."
    )

    @model_validator(mode="after")
    def _min_within_window(self) -> Self:
        if self.min_periods > self.window_periods:
            raise ValueError(
                f"min_periods ({self.min_periods}) cannot exceed window_periods "
                f"({self.window_periods})"
            )
        return self


class HealthFlag(enum.StrEnum):
    """Why a sensor is not healthy; an empty set means healthy."""

    STUCK = "stuck"
    DROPOUTS = "dropouts"
    SPIKES = "spikes"
    GAP_REJECTS = "gap_rejects"
    OUT_OF_DOMAIN = "out_of_domain"  # the sensor left the model's training domain
    MISSING_CHANNEL = "missing_channel"  # the sensor lacks an input channel of the model
    IMPLAUSIBLE = "implausible"  # the model's output for it was withheld in the recent window
    OFFLINE = "offline"
    # set from the reference comparison (tesla_gateway.monitor.drift), never by this module
    DRIFT = "drift"
    HARM = "harm"  # its reference pairs show the model worse than raw or a line (monitor.drift)


@dataclass(frozen=True, slots=True)
class HealthReport:
    """One sensor's health figures at one moment (the health topic's payload, docs/mqtt.md)."""

    flags: tuple[HealthFlag, ...]
    last_period: int | None
    window_periods: int  # grid periods the shares cover (fewer right after start)
    observed: int
    stuck_periods: int
    dropout_fraction: float
    spike_fraction: float
    gap_fraction: float
    above_p99_fraction: float
    above_max_fraction: float
    below_p01_fraction: float
    implausible_fraction: float
    range_distance: float | None
    recent_mean: float | None
    spike_bound: float | None
    seconds_since_update: float | None

    def figures(self) -> dict[str, object]:
        """The JSON-ready figures (without the flags)."""
        return {
            "window_periods": self.window_periods,
            "observed_periods": self.observed,
            "stuck_periods": self.stuck_periods,
            "dropout_fraction": _rounded(self.dropout_fraction),
            "spike_fraction": _rounded(self.spike_fraction),
            "gap_fraction": _rounded(self.gap_fraction),
            "above_p99_fraction": _rounded(self.above_p99_fraction),
            "above_max_fraction": _rounded(self.above_max_fraction),
            "below_p01_fraction": _rounded(self.below_p01_fraction),
            "implausible_fraction": _rounded(self.implausible_fraction),
            "range_distance": _rounded(self.range_distance),
            "recent_mean": _rounded(self.recent_mean),
            "spike_bound": _rounded(self.spike_bound),
            "seconds_since_update": _rounded(self.seconds_since_update, 1),
        }


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, digits)


class SensorHealth:
    """The health state of one (sensor, feature); fed one closed period at a time."""

    __slots__ = (
        "_alpha",
        "_boot",
        "_config",
        "_counts",
        "_first",
        "_last",
        "_last_raw",
        "_last_update_at",
        "_mean",
        "_missing_channel",
        "_ring",
        "_run",
        "_scale",
        "_window",
        "_withheld_stuck",
    )

    def __init__(self, config: HealthConfig) -> None:
        self._config = config
        self._window = config.window_periods
        self._alpha = 2.0 / (config.window_periods + 1)  # EW weight ~ the window's length
        self._ring = bytearray(self._window)  # bit set per grid period, at period % window
        self._counts = [0] * _BITS
        self._first: int | None = None
        self._last: int | None = None
        self._last_raw: float | None = None
        self._run = 0
        self._boot: list[float] = []  # first absolute jumps, until the scale is known
        self._scale: float | None = None
        self._mean: float | None = None
        self._missing_channel = False
        self._withheld_stuck = False  # the newest period's quality was stuck
        self._last_update_at: float | None = None

    # -- update -----------------------------------------------------------------------------

    def update(
        self,
        period: int,
        raw: float,
        quality: tuple[Quality, ...],
        input_range: InputRange | None,
        now: float,
    ) -> None:
        """Fold in one closed period (grid index ``period``, raw mean ``raw``, window quality).

        Periods must come in increasing order (the ticker's order); an older one is ignored.
        """
        if not math.isfinite(raw) or (self._last is not None and period <= self._last):
            return
        bits = 1 << _OBSERVED
        if self._spike(period, raw):
            bits |= 1 << _SPIKE
        if Quality.GAP in quality:
            bits |= 1 << _GAP
        if Quality.IMPLAUSIBLE in quality:
            bits |= 1 << _IMPLAUSIBLE
        if input_range is not None:
            if raw > input_range.p99:
                bits |= 1 << _ABOVE_P99
            if raw > input_range.max:
                bits |= 1 << _ABOVE_MAX
            if raw < input_range.p01:
                bits |= 1 << _BELOW_P01
        self._advance(period)
        self._set_slot(period % self._window, bits)
        last = math.nan if self._last_raw is None else self._last_raw
        self._run = max(next_run(last, self._run, raw), 1)  # the windows' rule (stuck.py)
        self._mean = raw if self._mean is None else self._mean + self._alpha * (raw - self._mean)
        self._missing_channel = Quality.MISSING_CHANNEL in quality
        self._withheld_stuck = Quality.STUCK in quality
        if self._first is None:
            self._first = period
        self._last = period
        self._last_raw = raw
        self._last_update_at = now

    def _spike(self, period: int, raw: float) -> bool:
        """Is this period a spike? Also updates the robust scale (consecutive periods only)."""
        if self._last is None or self._last_raw is None or period != self._last + 1:
            return False
        jump = abs(raw - self._last_raw)
        config = self._config
        if self._scale is None:
            self._boot.append(jump)
            if len(self._boot) >= config.min_periods:
                self._scale = statistics.median(self._boot)
                self._boot = []
            return False
        bound = max(config.spike_factor * self._scale, config.spike_min_jump)
        self._scale += self._alpha * (min(jump, bound) - self._scale)
        return jump > bound

    def _advance(self, period: int) -> None:
        """Empty the slots of the periods skipped since the last one."""
        if self._last is None:
            return
        if period - self._last >= self._window:
            self._ring[:] = bytes(self._window)
            self._counts = [0] * _BITS
            return
        for skipped in range(self._last + 1, period):
            self._set_slot(skipped % self._window, 0)

    def _set_slot(self, slot: int, bits: int) -> None:
        old = self._ring[slot]
        if old == bits:
            return
        counts = self._counts
        for bit in range(_BITS):
            mask = 1 << bit
            counts[bit] += bool(bits & mask) - bool(old & mask)
        self._ring[slot] = bits

    # -- report -----------------------------------------------------------------------------

    @property
    def last_period(self) -> int | None:
        return self._last

    def report(self, input_range: InputRange | None, now: float) -> HealthReport:
        """The figures and flags now (``now``: wall-clock seconds, for 'offline')."""
        config = self._config
        counts = self._counts
        span = 0 if self._last is None or self._first is None else self._last - self._first + 1
        span = min(span, self._window)
        observed = counts[_OBSERVED]

        def share(bit: int) -> float:
            return counts[bit] / observed if observed else 0.0

        dropout = 1.0 - observed / span if span else 0.0
        since = None if self._last_update_at is None else max(0.0, now - self._last_update_at)
        flags: list[HealthFlag] = []
        if self._run >= config.stuck_periods or self._withheld_stuck:
            flags.append(HealthFlag.STUCK)
        if span >= config.min_periods and dropout > config.max_dropout_fraction:
            flags.append(HealthFlag.DROPOUTS)
        judged = observed >= config.min_periods
        if judged and share(_SPIKE) > config.max_spike_fraction:
            flags.append(HealthFlag.SPIKES)
        if judged and share(_GAP) > config.max_gap_fraction:
            flags.append(HealthFlag.GAP_REJECTS)
        if judged and (
            share(_ABOVE_P99) > config.max_above_p99_fraction
            or share(_ABOVE_MAX) > config.max_above_max_fraction
            or share(_BELOW_P01) > config.max_below_p01_fraction
        ):
            flags.append(HealthFlag.OUT_OF_DOMAIN)
        if self._missing_channel:
            flags.append(HealthFlag.MISSING_CHANNEL)
        if counts[_IMPLAUSIBLE]:  # no min_periods: one nonsense value is enough to say so
            flags.append(HealthFlag.IMPLAUSIBLE)
        if since is not None and since > config.offline_after_s:
            flags.append(HealthFlag.OFFLINE)
        bound = (
            None
            if self._scale is None
            else max(config.spike_factor * self._scale, config.spike_min_jump)
        )
        return HealthReport(
            flags=tuple(flags),
            last_period=self._last,
            window_periods=span,
            observed=observed,
            stuck_periods=self._run,
            dropout_fraction=dropout,
            spike_fraction=share(_SPIKE),
            gap_fraction=share(_GAP),
            above_p99_fraction=share(_ABOVE_P99),
            above_max_fraction=share(_ABOVE_MAX),
            below_p01_fraction=share(_BELOW_P01),
            implausible_fraction=share(_IMPLAUSIBLE),
            range_distance=_range_distance(self._mean, input_range),
            recent_mean=self._mean,
            spike_bound=bound,
            seconds_since_update=since,
        )


def _range_distance(mean: float | None, input_range: InputRange | None) -> float | None:
    """Distance of ``mean`` from the training's [p01, p99], in units of that interval's width."""
    if mean is None or input_range is None:
        return None
    width = max(input_range.p99 - input_range.p01, 1e-9)
    if mean > input_range.p99:
        return (mean - input_range.p99) / width
    if mean < input_range.p01:
        return (input_range.p01 - mean) / width
    return 0.0

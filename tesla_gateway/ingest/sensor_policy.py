"""``[sensors]``: which sensor ids get windows; validated once at start, read by admission."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tesla_gateway.contract.readings import SENSOR_ID_PATTERN

__all__ = ["SensorPolicy"]


class SensorPolicy(BaseModel):
    """Which sensors the gateway calibrates."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allow_unknown: bool = Field(
        default=True,
        description="Accept any valid sensor id; false accepts only the ids in 'known'.",
    )
    known: list[str] = Field(default_factory=list, description="Sensor ids of this deployment.")
    max_sensors: int = Field(
        default=10_000,
        ge=1,
        le=1_000_000,
        description=(
            "Most sensor ids with windows at once, restored windows included: readings from "
            "further new ids are rejected (unknown_sensor), so ids from the wire cannot grow "
            "memory without bound. Sensors idle for evict_idle_s make room."
        ),
    )
    evict_idle_s: float = Field(
        default=7 * 86_400.0,
        ge=1,
        description=(
            "A sensor without a reading for this long (for a restored window: since the end of "
            "its newest period) is evicted: its windows are dropped and it no longer counts "
            "toward max_sensors."
        ),
    )

    @field_validator("known")
    @classmethod
    def _valid_ids(cls, value: list[str]) -> list[str]:
        for sensor_id in value:
            if not SENSOR_ID_PATTERN.fullmatch(sensor_id):
                raise ValueError(f"{sensor_id!r} must match {SENSOR_ID_PATTERN.pattern}")
        return value

    @property
    def admitted(self) -> frozenset[str] | None:
        """The sensor ids allowed (None: any valid id), as a set to look ids up in; admission
        takes it once and inlines :meth:`allows` per reading."""
        return None if self.allow_unknown else frozenset(self.known)

    def allows(self, sensor_id: str) -> bool:
        admitted = self.admitted
        return admitted is None or sensor_id in admitted

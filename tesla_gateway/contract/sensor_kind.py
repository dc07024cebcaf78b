"""Which low-cost PM sensor produced a series, and which of its value sets.

A model calibrates the sensor it was trained on. A Plantower PMS5003 reports two sets of PM
values: "atm" (atmospheric environment) and "cf_1" (factory CF=1, meant for indoor use), which
part above about 30 µg/m³ by design; an SDS011 or an SPS30 is another instrument altogether. The
manifest says what the model learned (``Manifest.sensor``), each source what it delivers, and
the start-up check refuses a source whose sensor differs (tesla_gateway/daemon/sensor_match.py).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["PMS5003_ATM", "PmValues", "SensorKind"]

# The two PM value sets of a Plantower sensor (PMS1003 ... PMS7003, PMSA003).
PmValues = Literal["atm", "cf_1"]

# Names of one sensor: the T/ST variants add temperature, humidity (and formaldehyde) to the
# same PM measurement.
_SAME_SENSOR = {"PMS5003T": "PMS5003", "PMS5003ST": "PMS5003"}


class SensorKind(BaseModel):
    """A sensor model, and for a Plantower sensor the value set, e.g. PMS5003 ``atm``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,31}$",
        description="Sensor model as its maker names it: 'PMS5003', 'SDS011', 'SPS30', ...",
    )
    values: PmValues | None = Field(
        default=None,
        description=(
            "Plantower value set: 'atm' (atmospheric environment) or 'cf_1' (CF=1); null for "
            "sensors with one set (SDS011, SPS30, ...)."
        ),
    )

    def __str__(self) -> str:
        return self.model if self.values is None else f"{self.model} {self.values}"

    def mismatch(self, trained: SensorKind) -> str | None:
        """Why this sensor's values do not fit a model trained on ``trained``, or None."""
        ours = _SAME_SENSOR.get(self.model.upper(), self.model.upper())
        theirs = _SAME_SENSOR.get(trained.model.upper(), trained.model.upper())
        if ours != theirs or (trained.values is not None and self.values != trained.values):
            return f"delivers {self} values, the model was trained on {trained}"
        return None


# What the serial PMS5003 source, the node firmware and the bundled models use.
PMS5003_ATM = SensorKind(model="PMS5003", values="atm")

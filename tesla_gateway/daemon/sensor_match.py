"""The start-up check that every source delivers what the models were trained on.

A model learned one sensor's values (``Manifest.sensor``, e.g. PMS5003 ``atm``); every source
feeds every model of its feature, so a source whose sensor or value set differs (PurpleAir's
default ``cf_1``, a Tasmota ``SDS0X1`` block) would be calibrated outside what the model learned,
with nothing in its output to show it. Each source that declares what it delivers (the fleet
kinds: ``FleetLimits.sensor_delivered``) is compared with each model's manifest: a mismatch is
fatal, with the fix, unless the source sets ``accept_sensor_mismatch``. A manifest without a
``sensor`` block (written before it existed) cannot be checked and is told as a warning.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.contract.sensor_kind import SensorKind
from tesla_gateway.daemon.config import GatewayConfig
from tesla_gateway.daemon.findings import Finding, Severity
from tesla_gateway.errors import ManifestError
from tesla_gateway.models.slots import candidates
from tesla_gateway.sources.fleet import FleetSourceConfig as FleetSource
from tesla_gateway.sources.fleet_common import FleetLimits

__all__ = ["check_sensor_kinds", "trained_sensor"]

_ACCEPT = "accept_sensor_mismatch = true"


def trained_sensor(model_dir: Path) -> tuple[str, SensorKind | None] | None:
    """(model name, the sensor it was trained on) from the manifest the daemon would serve
    first; None when no manifest there can be read (the model checks report that)."""
    for candidate in candidates(model_dir):
        try:
            manifest = load_manifest(candidate.path)
        except ManifestError:
            continue
        return manifest.name, manifest.sensor
    return None


def check_sensor_kinds(config: GatewayConfig) -> Iterator[Finding]:
    """One finding per source that declares its sensor (module doc), and per undeclared model."""
    trained = {
        slot: found
        for slot, model_dir in config.model_dirs.items()
        if (found := trained_sensor(model_dir)) is not None
    }
    declaring = [
        (index, source)
        for index, source in enumerate(config.sources)
        if isinstance(source, FleetLimits)
    ]
    if not declaring:
        return
    for slot, (name, sensor) in trained.items():
        if sensor is None:
            yield Finding(
                f"model {slot} sensor",
                Severity.WARNING,
                f"{name}'s manifest does not say which sensor it was trained on: the sources "
                "are not checked against it",
            )
    for index, source in declaring:
        yield _check_source(index, source, trained)


def _check_source(
    index: int, source: FleetSource, trained: dict[str, tuple[str, SensorKind | None]]
) -> Finding:
    check = f"sources[{index}] ({source.kind}) sensor"
    delivered = source.sensor_delivered()
    accepted = source.accept_sensor_mismatch
    problems = []
    for name, sensor in trained.values():
        if sensor is None:
            continue
        if delivered is None:
            problems.append(
                f"does not say what it delivers, {name} was trained on {sensor}: "
                f"{_declare(source, sensor)}, or {_ACCEPT}"
            )
        elif (why := delivered.mismatch(sensor)) is not None:
            problems.append(f"{why} ({name}): {_fix(source, delivered, sensor)}")
    if not problems:
        what = "not declared" if delivered is None else str(delivered)
        return Finding(check, Severity.OK, f"delivers {what}")
    if accepted:
        return Finding(
            check, Severity.WARNING, "; ".join(problems) + " (accepted: " + _ACCEPT + ")"
        )
    return Finding(check, Severity.FATAL, "; ".join(problems))


def _declare(source: FleetSource, trained: SensorKind) -> str:
    if getattr(source, "pm_sensor", None) == "auto":
        return (
            "set pm_sensor to the stations' PM sensor (PMS, SDS, NPM, SPS30, IPS) or delivers "
            f"= {_toml(trained)} if they all carry that sensor"
        )
    return f"set delivers = {_toml(trained)} if that is what its devices carry"


def _fix(source: FleetSource, delivered: SensorKind, trained: SensorKind) -> str:
    """What to change: the value set when only that differs and the source can read the other
    one, else a model trained on this sensor (or the acceptance)."""
    if (
        delivered.mismatch(trained.model_copy(update={"values": None})) is None
        and trained.values is not None
        and hasattr(source, "pm_kind")
    ):
        return f'set pm_kind = "{trained.values}" on this source, or {_ACCEPT}'
    return f"calibrate it with a model trained on {delivered}, or {_ACCEPT}"


def _toml(sensor: SensorKind) -> str:
    values = "" if sensor.values is None else f', values = "{sensor.values}"'
    return f'{{ model = "{sensor.model}"{values} }}'

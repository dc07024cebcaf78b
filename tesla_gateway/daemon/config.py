"""The daemon's configuration: one TOML file, environment overrides, validated once by pydantic.

Environment variables override the file: ``TESLA_GATEWAY__<SECTION>__<KEY>=<value>``, one
``__`` per nesting level, names case-insensitive, list items by index. The value is read as a
TOML value when it parses as one (``5``, ``true``, ``["a", "b"]``, ``"text"``) and as a plain
string otherwise. Examples::

    TESLA_GATEWAY__GATEWAY_ID=roof-1
    TESLA_GATEWAY__TICK__GRACE_S=5
    TESLA_GATEWAY__PUBLISHER__BROKER__HOST=mqtt.example.org
    TESLA_GATEWAY__SOURCES__0__BROKER__PORT=8883

Any problem becomes a :class:`ConfigError` whose message names the key (and the variable, when
the value came from the environment) and what is wrong with it.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tesla_gateway.cluster.config import ClusterConfig, gateway_id_problem
from tesla_gateway.contract.readings import GATEWAY_ID_PATTERN, Feature
from tesla_gateway.contract.time_of_day import zone_problem
from tesla_gateway.daemon.config_errors import explain, input_hint, tag_key
from tesla_gateway.daemon.config_paths import locate
from tesla_gateway.daemon.logging import LogFormat, LogLevel
from tesla_gateway.errors import ConfigError
from tesla_gateway.ingest.sensor_policy import SensorPolicy
from tesla_gateway.metrics.config import MetricsConfig
from tesla_gateway.models.runtime import DEFAULT_RUNTIME_PREFERENCE, RuntimeName
from tesla_gateway.models.trust import ModelTrust, SignaturePolicy
from tesla_gateway.monitor.drift import DriftConfig
from tesla_gateway.monitor.health import HealthConfig
from tesla_gateway.monitor.pairs import PairsConfig
from tesla_gateway.monitor.references import ReferenceConfig
from tesla_gateway.ota.config import OtaConfig
from tesla_gateway.publish.config import PublisherConfig
from tesla_gateway.publish.topics import OWN_PREFIX_PROBLEM, shares_levels
from tesla_gateway.sources.fleet import FleetSourceConfig
from tesla_gateway.sources.mqtt_source import MqttSourceConfig
from tesla_gateway.sources.serial_source import NodePortConfig, Pms5003PortConfig

__all__ = [
    "ENV_PREFIX",
    "GatewayConfig",
    "LoggingConfig",
    "ModelConfig",
    "MqttSourceEntry",
    "ReferenceConfig",
    "RuntimeConfig",
    "SensorPolicy",
    "SourceConfig",
    "StateConfig",
    "TickConfig",
    "apply_env_overrides",
    "load_config",
]

ENV_PREFIX = "TESLA_GATEWAY__"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MqttSourceEntry(MqttSourceConfig):
    """An MQTT source in the ``sources`` list (``kind = "mqtt"`` selects it)."""

    kind: Literal["mqtt"] = Field(description="Source kind: MQTT subscriber.")


SourceConfig = Annotated[
    MqttSourceEntry | NodePortConfig | Pms5003PortConfig | FleetSourceConfig,
    Field(discriminator="kind"),
]


MODEL_ID_PATTERN = r"^[a-z0-9_][a-z0-9_.+-]{0,63}$"


def model_slot_ids(models: Sequence[ModelConfig]) -> list[str]:
    """Each model's slot id: its ``id``, else the feature for the feature's first model (so a
    gateway that adds a second model keeps its first one's state), else the directory's name."""
    ids: list[str] = []
    seen: set[str] = set()
    for model in models:
        if model.id is not None:
            ids.append(model.id)
        elif model.feature not in seen:
            ids.append(model.feature)
        else:
            ids.append(model.model_dir.name)
        seen.add(model.feature)
    return ids


class ModelConfig(_Section):
    """One model in service: the feature it calibrates and the directory it is read from.

    A feature may have several models with different input channels (PM alone; PM, humidity
    and temperature): each sensor is calibrated by the one with the most channels it supplies.
    """

    feature: Feature = Field(description="Feature the model calibrates.")
    id: str | None = Field(
        default=None,
        pattern=MODEL_ID_PATTERN,
        description=(
            "Name of this model slot in stats, logs and state files; default: the feature for "
            "a feature's first model, the directory's name for the others."
        ),
    )
    model_dir: Path = Field(
        description="Model directory (manifest.json + model.tflite); watched for new versions."
    )
    signature: SignaturePolicy = Field(
        default="auto",
        description=(
            "'auto': a directory the daemon can write must hold a signed release.json that "
            "verifies with [ota] public_key_file (when one is configured); 'required': always; "
            "'off': sha256 only. See docs/deployment.md."
        ),
    )


class RuntimeConfig(_Section):
    """Which TFLite interpreter runs the models."""

    preference: list[RuntimeName] = Field(
        default_factory=lambda: list(DEFAULT_RUNTIME_PREFERENCE),
        min_length=1,
        description="Interpreters to try, in order: ai_edge_litert, tflite_runtime, tensorflow.",
    )
    num_threads: int | None = Field(
        default=None, ge=1, le=64, description="Interpreter threads; default: the runtime's."
    )
    model_poll_s: float = Field(
        default=30.0, gt=0, description="Seconds between checks of the model directories."
    )


class LoggingConfig(_Section):
    """Log output of the daemon (structlog)."""

    format: LogFormat = Field(
        default="auto", description="json, console, or auto (console on a TTY, else JSON)."
    )
    level: LogLevel = Field(default="info", description="Lowest level logged.")


class TickConfig(_Section):
    """When closed periods are calibrated."""

    grace_s: float = Field(
        default=10.0,
        ge=0,
        le=86_400,
        description=(
            "Wall-clock fallback: a sensor's period is closed at most this long after its end "
            "(or after its last reading, for replayed data) even if no later reading arrives."
        ),
    )
    settle_s: float = Field(
        default=1.0,
        ge=0,
        le=600,
        description=(
            "After the first sensor crosses a period boundary, wait this long for the others "
            "so that all of them are calibrated in one batched invoke."
        ),
    )


class StateConfig(_Section):
    """How often the windows and the status file are written."""

    # The directory itself is the top-level ``state_dir``.

    save_interval_s: float = Field(
        default=60.0, gt=0, description="Seconds between window snapshots (and at shutdown)."
    )
    status_interval_s: float = Field(
        default=10.0,
        gt=0,
        description="Seconds between updates of state_dir/status.json and the stats snapshot.",
    )
    ingest_log_fsync_s: float | None = Field(
        default=1.0,
        gt=0,
        description=(
            "Seconds between fsyncs of the ingest log (readings are written to it before they "
            "are acknowledged, which survives a SIGKILL; the fsync bounds what a power cut can "
            "lose); null: never fsync."
        ),
    )
    ingest_log_max_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=64 * 1024,
        description=(
            "Bound on the ingest log (state_dir/ingest-log); beyond it the oldest segment is "
            "dropped and its readings counted. It holds the readings since the last snapshot."
        ),
    )


class GatewayConfig(_Section):
    """The whole daemon configuration (see deploy/gateway.example.toml)."""

    gateway_id: str = Field(
        pattern=GATEWAY_ID_PATTERN.pattern,
        description="This gateway's name: in topics, client ids and logs.",
    )
    state_dir: Path = Field(
        description="Directory for window snapshots, the outbox, status.json and the pid file."
    )
    models: list[ModelConfig] = Field(min_length=1, description="Models in service.")
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    sources: list[SourceConfig] = Field(
        default_factory=list, description="Where readings come from (docs/sources.md)."
    )
    publisher: PublisherConfig = Field(
        default_factory=PublisherConfig, description="Where calibrated readings go."
    )
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    tick: TickConfig = Field(default_factory=TickConfig)
    sensors: SensorPolicy = Field(default_factory=SensorPolicy)
    state: StateConfig = Field(default_factory=StateConfig)
    ota: OtaConfig | None = Field(
        default=None, description="Signed over-the-air model updates; omit to disable."
    )
    health: HealthConfig = Field(
        default_factory=HealthConfig, description="Per-sensor health signals (no reference)."
    )
    references: list[ReferenceConfig] = Field(
        default_factory=list,
        description="Co-located reference stations on MQTT: pairs dataset and rolling error.",
    )
    pairs: PairsConfig = Field(
        default_factory=PairsConfig, description="How reference pairs are formed and recorded."
    )
    drift: DriftConfig = Field(
        default_factory=DriftConfig, description="Rolling error vs reference and drift events."
    )
    metrics: MetricsConfig | None = Field(
        default=None,
        description="Prometheus /metrics endpoint (the 'metrics' extra); omit to disable.",
    )
    cluster: ClusterConfig | None = Field(
        default=None,
        description=(
            "Cluster mode: gateways share a partitioned NATS JetStream stream of readings (the "
            "'cluster' extra; docs/deployment.md); omit for one gateway."
        ),
    )
    timezone: str | None = Field(
        default=None,
        description=(
            "IANA zone the sensors are in (e.g. 'Europe/Rome'), for models that read the hour "
            "of the day (hour_sin, hour_cos); its standard time is used. Default: the zone of "
            "the gateway's system."
        ),
    )

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str | None) -> str | None:
        if value is not None and (problem := zone_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _cluster_reads_the_stream(self) -> GatewayConfig:
        if self.cluster is not None and any(s.kind == "mqtt" for s in self.sources):
            raise ValueError(
                "cluster: the gateways read MQTT readings from the stream (nodes publish to "
                "nats-server's MQTT listener): remove the mqtt [[sources]]"
            )
        if self.cluster is not None:
            if (problem := gateway_id_problem(self.gateway_id)) is not None:
                raise ValueError(problem)
            own = self.publisher.topic_prefix or f"tesla/{self.gateway_id}"
            if shares_levels(own, self.cluster.calibrated_topic_prefix):
                raise ValueError(
                    OWN_PREFIX_PROBLEM.format(own, self.cluster.calibrated_topic_prefix)
                )
        return self

    @field_validator("models")
    @classmethod
    def _model_ids_unique(cls, value: list[ModelConfig]) -> list[ModelConfig]:
        ids = model_slot_ids(value)
        for later, slot in enumerate(ids):
            first = ids.index(slot)
            if first != later:
                raise ValueError(
                    f"entries {first + 1} and {later + 1} share a slot name (a feature's first "
                    "model is named by the feature, the others by their directory's name): "
                    "give each an 'id'"
                )
        for position, slot in enumerate(ids):
            if not re.fullmatch(MODEL_ID_PATTERN, slot):
                raise ValueError(
                    f"entry {position + 1}: its directory's name cannot name a slot: set 'id' "
                    f"(matching {MODEL_ID_PATTERN})"
                )
        return value

    @model_validator(mode="after")
    def _references_consistent(self) -> GatewayConfig:
        names = [reference.name for reference in self.references]
        if len(set(names)) != len(names):
            raise ValueError(f"references: names must be unique, got {names}")
        features = {model.feature for model in self.models}
        placed: dict[tuple[str, str], str] = {}
        for reference in self.references:
            if reference.feature not in features:
                raise ValueError(
                    f"references: {reference.name} measures {reference.feature}, "
                    f"but no model calibrates it (models: {sorted(features)})"
                )
            for sensor_id in reference.colocated_with:
                other = placed.setdefault((sensor_id, reference.feature), reference.name)
                if other != reference.name:
                    raise ValueError(
                        f"references: sensor {sensor_id} is co-located with both {other} and "
                        f"{reference.name} for {reference.feature}; keep one"
                    )
        return self

    @model_validator(mode="after")
    def _signature_needs_key(self) -> GatewayConfig:
        required = [m.id or m.feature for m in self.models if m.signature == "required"]
        if required and self.ota is None:
            raise ValueError(
                f"models {required} have signature = 'required': add an [ota] section with "
                "public_key_file"
            )
        return self

    def model_trust(self) -> dict[str, ModelTrust]:
        """The signature rule of each model slot (reads the release key file, if configured)."""
        from tesla_gateway.ota.release import load_public_key

        key = None if self.ota is None else load_public_key(self.ota.public_key_file)
        ids = model_slot_ids(self.models)
        return {i: ModelTrust(m.signature, key) for i, m in zip(ids, self.models, strict=True)}

    @property
    def model_dirs(self) -> dict[str, Path]:
        """Slot id -> model directory, in configuration order."""
        ids = model_slot_ids(self.models)
        return {i: m.model_dir for i, m in zip(ids, self.models, strict=True)}

    @property
    def model_features(self) -> dict[str, str]:
        """Slot id -> the feature its model calibrates."""
        ids = model_slot_ids(self.models)
        return {i: m.feature for i, m in zip(ids, self.models, strict=True)}

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "gateway.pid"

    @property
    def status_file(self) -> Path:
        return self.state_dir / "status.json"


def load_config(path: Path, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """Read, override from the environment, validate; every failure is a ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"configuration file {path} does not exist") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read configuration file {path}: {exc}") from exc
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path} is not valid TOML: {exc}") from exc
    sources = apply_env_overrides(data, os.environ if environ is None else environ)
    base = path.parent
    try:
        config = GatewayConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(path, exc, sources)) from exc
    return _resolve_paths(config, base)


def apply_env_overrides(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, str]:
    """Merge ``TESLA_GATEWAY__...`` variables into ``data``; returns dotted key -> variable."""
    applied: dict[str, str] = {}
    for name in sorted(environ):
        if not name.upper().startswith(ENV_PREFIX) or len(name) == len(ENV_PREFIX):
            continue
        parts = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if any(not part for part in parts):
            raise ConfigError(f"environment variable {name}: empty key between '__'")
        _set_path(data, parts, _parse_env_value(environ[name]), name)
        applied[".".join(parts)] = name
    return applied


def _set_path(data: dict[str, Any], parts: list[str], value: object, variable: str) -> None:
    node: Any = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(
                    f"environment variable {variable}: {'.'.join(parts[:depth])} has no item "
                    f"{part} (it has {len(node)})"
                )
            key: int | str = int(part)
        elif isinstance(node, dict):
            key = part
        else:
            raise ConfigError(
                f"environment variable {variable}: {'.'.join(parts[:depth])} is not a section"
            )
        if last:
            node[key] = value
        else:
            if isinstance(node, dict) and key not in node:
                node[key] = {}
            node = node[key]


def _parse_env_value(raw: str) -> object:
    try:
        return tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        return raw


def _describe(path: Path, exc: ValidationError, env_keys: Mapping[str, str]) -> str:
    """One line per error: the TOML path (``sources[0].broker.port``, config_paths), what is
    wrong in TOML's words with a "did you mean" for a mistyped key (config_errors), and the
    environment variable that set it."""
    lines = [f"{path}: {exc.error_count()} problem(s) in the configuration:"]
    for error in exc.errors():
        tag = tag_key(error)  # sources[0].kind, where pydantic says sources.0
        where = locate(GatewayConfig, [*error["loc"], *([tag] if tag else [])])
        origin = _env_origin(where.dotted, env_keys)
        suffix = f" (set by {origin})" if origin else ""
        # Never the value: it may be a password under a wrong key
        # (tesla_gateway/daemon/config_errors.py).
        problem = explain(error, where.allowed)
        lines.append(f"  {where.path or '<root>'}: {problem}{input_hint(error)}{suffix}")
    return "\n".join(lines)


def _env_origin(key: str, env_keys: Mapping[str, str]) -> str | None:
    """The variable that set ``key`` (dotted, as config_paths gives it) or a section above or
    below it."""
    for dotted, variable in env_keys.items():
        if key == dotted or key.startswith(dotted + ".") or dotted.startswith(key + "."):
            return variable
    return None


def _resolve_paths(config: GatewayConfig, base: Path) -> GatewayConfig:
    """Relative paths in the file are relative to the file, not to the working directory."""

    def resolve(path: Path) -> Path:
        return path if path.is_absolute() else (base / path).resolve()

    models = [
        model.model_copy(update={"model_dir": resolve(model.model_dir)}) for model in config.models
    ]
    update: dict[str, object] = {"state_dir": resolve(config.state_dir), "models": models}
    if config.ota is not None:
        key = resolve(config.ota.public_key_file)
        update["ota"] = config.ota.model_copy(update={"public_key_file": key})
    return config.model_copy(update=update)

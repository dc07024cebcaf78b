"""The ``[ota]`` section of the gateway configuration."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.topics import PublishTopic
from tesla_gateway.ota.protocol import DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE
from tesla_gateway.ota.release import ROLLOUT_NAME

__all__ = ["OtaConfig"]


class OtaConfig(BaseModel):
    """Over-the-air model updates: which key to trust, where releases arrive, how to relay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    public_key_file: Path = Field(
        description="Ed25519 public key (hex, from `tesla-train keygen`); only releases signed "
        "by its private key are installed or relayed. Relative to the config file."
    )
    releases_topic_prefix: str = Field(
        default="tesla/releases",
        min_length=1,
        description="Releases arrive on <prefix>/gateway/<model> and <prefix>/node/<model>.",
    )
    status_topic_prefix: str | None = Field(
        default=None,
        description="Update status goes to <prefix>/gateway and <prefix>/node/<node_id>; "
        "default 'tesla/<gateway_id>/ota'.",
    )
    broker: MqttBrokerConfig | None = Field(
        default=None, description="Broker for releases and status; default: the publisher's."
    )
    allow_downgrade: bool = Field(
        default=False,
        description="Install gateway releases that are not newer than the running model, and "
        "serve at start or reload a model older than the one its slot served last "
        "(<state_dir>/served-versions.json). For an operator's deliberate rollback only.",
    )
    groups: list[str] = Field(
        default_factory=list,
        description="Rollout groups this gateway belongs to (e.g. 'canary'): a release that "
        "names gateways or groups in its signed rollout is installed only by those.",
    )
    relay_to_nodes: bool = Field(
        default=True, description="Forward node releases to serial-attached nodes that need them."
    )
    chunk_size: int = Field(
        default=DEFAULT_CHUNK_SIZE,
        ge=16,
        le=MAX_CHUNK_SIZE,
        description="Image bytes per OTA chunk line.",
    )
    ack_timeout_s: float = Field(
        default=2.0, gt=0, le=60, description="Wait this long for a node's answer to a frame."
    )
    commit_timeout_s: float = Field(
        default=30.0, gt=0, le=600, description="Wait this long for a node to boot and self-test."
    )
    max_retries: int = Field(
        default=10, ge=1, le=1000, description="Retransmissions of one frame before giving up."
    )

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: list[str]) -> list[str]:
        for group in value:
            if not ROLLOUT_NAME.fullmatch(group):
                raise ValueError(f"group {group!r} must match {ROLLOUT_NAME.pattern}")
        return value

    @field_validator("releases_topic_prefix", "status_topic_prefix")
    @classmethod
    def _plain_topic(cls, value: str | None) -> str | None:
        return None if value is None else PublishTopic(value)

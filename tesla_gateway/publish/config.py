"""The publisher's configuration: broker, topics, what is published and how it is queued."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tesla_gateway.mqtt.config import MqttBrokerConfig
from tesla_gateway.mqtt.topics import PublishTopic

__all__ = ["PublisherConfig"]


class PublisherConfig(BaseModel):
    """Where and how calibrated readings are published."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    broker: MqttBrokerConfig = Field(
        default_factory=MqttBrokerConfig, description="Broker to publish to."
    )
    topic_prefix: str | None = Field(
        default=None, description="Topic prefix; default 'tesla/<gateway_id>'."
    )
    client_id: str | None = Field(
        default=None, max_length=64, description="Client id; default tesla-gateway-<id>-out."
    )
    qos: Literal[1, 2] = Field(
        default=1, description="QoS of calibrated readings (at least 1: the outbox needs acks)."
    )
    retain: bool = Field(default=True, description="Retain the latest value of each topic.")
    stats_interval_s: float = Field(
        default=60.0, gt=0, description="How often the stats topic is published."
    )
    discovery: bool = Field(default=False, description="Publish Home Assistant discovery configs.")
    discovery_prefix: str = Field(
        default="homeassistant", min_length=1, description="Home Assistant discovery prefix."
    )
    discovery_support_url: str | None = Field(
        default=None,
        pattern=r"^https?://\S+$",
        description="Optional 'support_url' of the discovery origin block (an http(s) URL).",
    )
    discovery_expire_after_s: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Home Assistant's 'expire_after' of the calibrated and raw entities: unavailable "
            "without a value for this long (above the longest period). Null: never; cluster "
            "mode: set it, so sensors go unavailable if every gateway is gone."
        ),
    )
    sensor_offline_after_s: float | None = Field(
        default=600.0,
        gt=0,
        description=(
            "A sensor without a reading for this long goes 'offline' on "
            "<prefix>/<sensor>/availability (and unavailable in Home Assistant); null: no "
            "per-sensor availability topics."
        ),
    )
    outbox_max_messages: int = Field(
        default=100_000,
        ge=1,
        description="Bound of the store-and-forward queue; beyond it the oldest are dropped.",
    )
    in_flight: int = Field(
        default=256,
        ge=1,
        le=65_535,
        description=(
            "Messages sent ahead while awaiting PUBACKs (a sliding window); the broker's "
            "MQTT 5 Receive Maximum caps it (mosquitto: max_inflight_messages, default 20)."
        ),
    )
    shutdown_flush_s: float = Field(
        default=5.0, ge=0, description="On shutdown, how long to keep delivering queued messages."
    )
    per_sensor_topics: bool = Field(
        default=True,
        description="Publish each calibrated reading on <prefix>/<sensor_id>/<feature>.",
    )
    batch_topic: bool = Field(
        default=False,
        description=(
            "Also (or, with per_sensor_topics = false, only) publish each tick's readings as JSON "
            "arrays on <prefix>/_batch/<feature>: one message per batch_max_readings readings."
        ),
    )
    batch_max_readings: int = Field(
        default=1000, ge=1, le=100_000, description="Most readings in one batch message."
    )

    @field_validator("topic_prefix", "discovery_prefix")
    @classmethod
    def _plain_topic(cls, value: str | None) -> str | None:
        return None if value is None else PublishTopic(value)

    @model_validator(mode="after")
    def _publishes_readings(self) -> Self:
        if not (self.per_sensor_topics or self.batch_topic):
            raise ValueError("per_sensor_topics and batch_topic cannot both be false")
        return self

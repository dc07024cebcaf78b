"""Topic types that check themselves: a bad topic in the config fails when it is loaded."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from tesla_gateway.mqtt.topics import PublishTopic, TopicFilter
from tesla_gateway.ota.config import OtaConfig
from tesla_gateway.publish.config import PublisherConfig
from tesla_gateway.sources.mqtt_source import MqttSourceConfig

GOOD_TOPICS = ["tesla", "tesla/gw-1", "a/b/c", "with space/ünïcode"]
BAD_TOPICS = ["", "/tesla", "tesla/", "a//b", "a/+/b", "a/#", "+", "#", "a+b"]
GOOD_FILTERS = ["sensors/+/raw", "#", "+", "a/#", "+/+/x", "a/b", "/leading", "trailing/"]
BAD_FILTERS = ["", "a/#/b", "a#", "#/a", "a/b+", "+a/b", "a/##"]


@pytest.mark.parametrize("topic", GOOD_TOPICS)
def test_a_publish_topic_is_the_string_it_was_made_from(topic: str) -> None:
    checked = PublishTopic(topic)
    assert checked == topic and isinstance(checked, str)


@pytest.mark.parametrize("topic", BAD_TOPICS)
def test_a_publish_topic_refuses_wildcards_and_empty_levels(topic: str) -> None:
    with pytest.raises(ValueError, match="without wildcards or empty/leading/trailing levels"):
        PublishTopic(topic)


@pytest.mark.parametrize("topic_filter", GOOD_FILTERS)
def test_a_topic_filter_takes_wildcards_as_whole_levels(topic_filter: str) -> None:
    assert TopicFilter(topic_filter) == topic_filter


@pytest.mark.parametrize("topic_filter", BAD_FILTERS)
def test_a_topic_filter_refuses_wildcards_inside_levels(topic_filter: str) -> None:
    with pytest.raises(ValueError, match="is not a valid MQTT topic filter"):
        TopicFilter(topic_filter)


@pytest.mark.parametrize("topic_filter", BAD_FILTERS)
def test_the_mqtt_source_config_refuses_a_bad_filter(topic_filter: str) -> None:
    with pytest.raises(ValidationError, match="is not a valid MQTT topic filter"):
        MqttSourceConfig(topics=["sensors/+/raw", topic_filter])


@pytest.mark.parametrize("topic", BAD_TOPICS[1:])  # an empty prefix is refused by its length
def test_publisher_and_ota_configs_refuse_a_bad_prefix(topic: str) -> None:
    with pytest.raises(ValidationError, match="without wildcards"):
        PublisherConfig(topic_prefix=topic)
    with pytest.raises(ValidationError, match="without wildcards"):
        OtaConfig.model_validate({"status_topic_prefix": topic})


def test_checked_topics_serialise_as_plain_strings() -> None:
    config = MqttSourceConfig(topics=["sensors/+/raw", "lab/#"])
    assert all(type(topic) is TopicFilter for topic in config.topics)
    assert json.loads(config.model_dump_json())["topics"] == ["sensors/+/raw", "lab/#"]
    assert MqttSourceConfig.model_validate_json(config.model_dump_json()) == config
    assert MqttSourceConfig.model_json_schema()["properties"]["topics"]["items"] == {
        "type": "string"
    }

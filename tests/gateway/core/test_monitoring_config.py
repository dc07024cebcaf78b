"""The [health], [[references]], [pairs] and [drift] sections: defaults, validation, environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from tesla_gateway.daemon.config import load_config
from tesla_gateway.errors import ConfigError

MINIMAL = """
gateway_id = "gw-1"
state_dir = "state"
[[models]]
feature = "pm10"
model_dir = "models/pm10"
"""

REFERENCE = """
[[references]]
name = "{name}"
feature = "{feature}"
colocated_with = {sensors}
[references.mqtt]
topics = ["reference/{name}"]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return path


def reference(name: str, feature: str = "pm10", sensors: str = '["s1"]') -> str:
    return REFERENCE.format(name=name, feature=feature, sensors=sensors)


def test_defaults_without_sections(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={})
    assert config.health.enabled and config.health.window_periods == 60
    assert config.references == []
    assert config.pairs.max_file_bytes == 16 * 1024 * 1024
    assert (config.drift.rmse_abs, config.drift.rmse_ratio) == (0.0, 2.0)


def test_a_reference_is_read(tmp_path: Path) -> None:
    text = MINIMAL + reference("ref-1", sensors='["s1", "s2"]')
    config = load_config(write(tmp_path, text), environ={})
    (ref,) = config.references
    assert (ref.name, ref.feature, ref.colocated_with) == ("ref-1", "pm10", ["s1", "s2"])
    assert ref.mqtt.topics == ["reference/ref-1"]


def test_reference_topics_are_required(tmp_path: Path) -> None:
    text = MINIMAL + '[[references]]\nname = "r"\nfeature = "pm10"\ncolocated_with = ["s1"]\n'
    text += "[references.mqtt]\nqos = 1\n"
    with pytest.raises(ConfigError, match=r"references\[0\]: mqtt\.topics must be given"):
        load_config(write(tmp_path, text), environ={})


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (reference("r") + reference("r"), "names must be unique"),
        (reference("r", feature="pm1"), "no model calibrates it"),
        (reference("a") + reference("b"), "co-located with both a and b"),
    ],
)
def test_inconsistent_references_are_refused(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, MINIMAL + extra), environ={})


def test_thresholds_are_validated_and_overridable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"health: .*min_periods"):
        load_config(
            write(tmp_path, MINIMAL + "[health]\nwindow_periods = 5\nmin_periods = 6\n"),
            environ={},
        )
    with pytest.raises(ConfigError, match=r"drift\.clear_fraction"):
        load_config(write(tmp_path, MINIMAL + "[drift]\nclear_fraction = 1.5\n"), environ={})
    config = load_config(
        write(tmp_path, MINIMAL),
        environ={
            "TESLA_GATEWAY__DRIFT__RMSE_ABS": "7.5",
            "TESLA_GATEWAY__HEALTH__ENABLED": "false",
        },
    )
    assert config.drift.rmse_abs == 7.5 and not config.health.enabled


def test_an_environment_error_in_a_reference_names_the_variable(tmp_path: Path) -> None:
    variable = "TESLA_GATEWAY__REFERENCES__0__MQTT__BROKER__PORT"
    with pytest.raises(
        ConfigError, match=rf"references\[0\]\.mqtt\.broker\.port: .*set by {variable}"
    ):
        load_config(write(tmp_path, MINIMAL + reference("r")), environ={variable: "0"})

"""Configuration: errors name the key, the environment overrides, the example is valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from tesla_gateway.daemon.cli import main
from tesla_gateway.daemon.config import MqttSourceEntry, load_config
from tesla_gateway.errors import ConfigError
from tesla_gateway.sources.serial_source import NodePortConfig, Pms5003PortConfig
from tests.support.models import ModelFactory

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "gateway.example.toml"

MINIMAL = """
gateway_id = "gw-1"
state_dir = "state"
[[models]]
feature = "pm10"
model_dir = "models/pm10"
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_example_config_is_valid() -> None:
    config = load_config(EXAMPLE, environ={})
    kinds = [type(source) for source in config.sources]
    assert kinds == [MqttSourceEntry, NodePortConfig, Pms5003PortConfig]
    assert set(config.model_dirs) == {"pm10", "pm2_5"}


def test_minimal_config_gets_defaults_and_resolves_paths(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={})
    assert config.state_dir == tmp_path / "state"
    assert config.model_dirs == {"pm10": tmp_path / "models" / "pm10"}
    assert config.tick.grace_s == 10.0
    assert config.runtime.preference[0] == "ai_edge_litert"
    assert config.publisher.broker.host == "127.0.0.1"


def test_unknown_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tick\.grace: unknown key; did you mean 'grace_s'\?"):
        load_config(write(tmp_path, MINIMAL + "[tick]\ngrace = 3\n"), environ={})


def test_wrong_value_names_key_and_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"tick\.grace_s: must be at least 0 \(got -1\)"):
        load_config(write(tmp_path, MINIMAL + "[tick]\ngrace_s = -1\n"), environ={})


def test_missing_required_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"gateway_id: missing \(required\)"):
        load_config(write(tmp_path, MINIMAL.replace('gateway_id = "gw-1"', "")), environ={})


def test_unknown_source_kind_and_bad_nested_key(tmp_path: Path) -> None:
    text = MINIMAL + '[[sources]]\nkind = "carrier-pigeon"\n'
    with pytest.raises(
        ConfigError, match=r"sources\[0\]\.kind: expected one of 'mqtt', 'node', 'pms5003'"
    ):
        load_config(write(tmp_path, text), environ={})
    text = MINIMAL + '[[sources]]\nkind = "mqtt"\n[sources.broker]\nport = 70000\n'
    with pytest.raises(ConfigError, match=r"sources\[0\]\.broker\.port: must be at most 65535"):
        load_config(write(tmp_path, text), environ={})


def test_a_feature_may_have_several_models_each_in_its_own_slot(tmp_path: Path) -> None:
    text = MINIMAL + '[[models]]\nfeature = "pm10"\nmodel_dir = "models/pm10-rh-temp"\n'
    config = load_config(write(tmp_path, text), environ={})
    # The first keeps the feature's name (its state survives adding a second model).
    assert config.model_dirs == {
        "pm10": tmp_path / "models" / "pm10",
        "pm10-rh-temp": tmp_path / "models" / "pm10-rh-temp",
    }
    assert config.model_features == {"pm10": "pm10", "pm10-rh-temp": "pm10"}
    named = MINIMAL + '[[models]]\nfeature = "pm10"\nmodel_dir = "x"\nid = "pm10.covariates"\n'
    assert list(load_config(write(tmp_path, named), environ={}).model_dirs) == [
        "pm10",
        "pm10.covariates",
    ]


def test_two_models_in_one_slot_are_refused(tmp_path: Path) -> None:
    same_dir_name = MINIMAL + '[[models]]\nfeature = "pm10"\nmodel_dir = "other/pm10"\n'
    with pytest.raises(
        ConfigError, match=r"models: .*entries 1 and 2 share a slot name.*give each an 'id'"
    ):
        load_config(write(tmp_path, same_dir_name), environ={})
    bad_name = MINIMAL + '[[models]]\nfeature = "pm10"\nmodel_dir = "Other Model"\n'
    with pytest.raises(
        ConfigError, match=r"models: .*entry 2: its directory's name cannot name a slot: set 'id'"
    ):
        load_config(write(tmp_path, bad_name), environ={})


def test_toml_syntax_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not valid TOML.*line 2"):
        load_config(write(tmp_path, "gateway_id = 'x'\nstate_dir = \n"), environ={})


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.toml", environ={})


def test_environment_overrides(tmp_path: Path) -> None:
    text = MINIMAL + '[[sources]]\nkind = "mqtt"\n'
    environ = {
        "TESLA_GATEWAY__GATEWAY_ID": "from-env",
        "TESLA_GATEWAY__TICK__GRACE_S": "2.5",
        "TESLA_GATEWAY__PUBLISHER__BROKER__HOST": "mqtt.example.org",
        "TESLA_GATEWAY__SOURCES__0__BROKER__PORT": "8883",
        "TESLA_GATEWAY__SOURCES__0__TOPICS": '["a/+", "b/+"]',
        "TESLA_GATEWAY__SENSORS__ALLOW_UNKNOWN": "false",
        "OTHER_VARIABLE": "ignored",
    }
    config = load_config(write(tmp_path, text), environ=environ)
    assert config.gateway_id == "from-env"
    assert config.tick.grace_s == 2.5
    assert config.publisher.broker.host == "mqtt.example.org"
    source = config.sources[0]
    assert isinstance(source, MqttSourceEntry)
    assert source.broker.port == 8883
    assert source.topics == ["a/+", "b/+"]
    assert not config.sensors.allows("stranger")


def test_bad_environment_value_names_the_variable(tmp_path: Path) -> None:
    environ = {"TESLA_GATEWAY__TICK__GRACE_S": "soon"}
    with pytest.raises(
        ConfigError, match=r"tick\.grace_s: .*\(set by TESLA_GATEWAY__TICK__GRACE_S\)"
    ):
        load_config(write(tmp_path, MINIMAL), environ=environ)
    environ = {"TESLA_GATEWAY__SOURCES__3__KIND": "mqtt"}
    with pytest.raises(
        ConfigError, match=r"TESLA_GATEWAY__SOURCES__3__KIND: sources has no item 3"
    ):
        load_config(write(tmp_path, "sources = []\n" + MINIMAL), environ=environ)


def test_check_config_command(
    tmp_path: Path, model_factory: ModelFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    model_factory.copy(tmp_path / "models" / "pm10")
    path = write(tmp_path, MINIMAL)
    assert main(["check-config", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert "configuration OK" in out and "test-tesla v1" in out and "ai_edge_litert" in out
    (tmp_path / "models" / "pm10" / "manifest.json").unlink()
    assert main(["check-config", "--config", str(path)]) == 1
    assert "REFUSED" in capsys.readouterr().err
    bad = write(tmp_path, MINIMAL + "[tick]\ngrace = 3\n")
    assert main(["check-config", "--config", str(bad)]) == 2
    assert "tick.grace" in capsys.readouterr().err


def test_ingest_log_settings(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), environ={})
    assert config.state.ingest_log_fsync_s == 1.0
    assert config.state.ingest_log_max_bytes == 256 * 1024 * 1024
    tuned = load_config(
        write(tmp_path, MINIMAL + "[state]\ningest_log_fsync_s = 5\n"),
        environ={"TESLA_GATEWAY__STATE__INGEST_LOG_MAX_BYTES": "1048576"},
    )
    assert tuned.state.ingest_log_fsync_s == 5.0
    assert tuned.state.ingest_log_max_bytes == 1 << 20
    with pytest.raises(ConfigError, match="ingest_log_fsync_s"):
        load_config(write(tmp_path, MINIMAL + "[state]\ningest_log_fsync_s = 0\n"), environ={})
    with pytest.raises(ConfigError, match="ingest_log_max_byte"):
        load_config(write(tmp_path, MINIMAL + "[state]\ningest_log_max_byte = 10\n"), environ={})

"""``tesla-gateway init``: the configuration it writes is the one asked for, and valid.

In-process and fast; the installed wheel running the same commands is tests/packaging.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from devkit.broker import make_test_pki
from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.daemon.cli import main
from tesla_gateway.daemon.config import GatewayConfig, load_config
from tesla_gateway.models.bundled import bundled_model_dirs, bundled_models, example_config

REPO = Path(__file__).resolve().parents[3]


def test_bundled_models_are_found_by_their_manifests_feature() -> None:
    models = bundled_models()
    assert set(models) == {"pm10", "pm2_5"}
    for feature, model_dirs in models.items():
        assert [load_manifest(d).feature for d in model_dirs] == [feature] * len(model_dirs)
    # The fewest channels first: that model serves every sensor of the feature.
    assert [len(load_manifest(d).input_channels) for d in models["pm10"]] == [1, 3]
    assert set(bundled_model_dirs()) == {"pm10", "pm10-ispra-1min-rh-temp", "pm2_5"}
    assert example_config().read_text(encoding="utf-8").startswith("# tesla-gateway")


def test_init_writes_what_was_asked_and_check_config_accepts_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gateway.toml"
    password = tmp_path / "mqtt-password"
    password.write_text("secret\n", encoding="utf-8")
    args = ["init", "--out", str(out), "--gateway-id", "pi-kitchen"]
    args += ["--feature", "pm10", "--feature", "pm2_5", "--broker-host", "mqtt.local"]
    args += ["--broker-port", "8883", "--username", "tesla", "--password-file", str(password)]
    ca = make_test_pki(tmp_path / "pki").ca  # check-config loads it, as run does
    args += ["--ca-file", str(ca), "--sensor", "node-01", "--sensor", "node-02"]
    args += ["--serial-port", "/dev/ttyACM0", "--pms5003", "usb-pms=/dev/ttyUSB0"]
    args += ["--topic", "home/+/pm", "--home-assistant"]
    assert main(args) == 0
    assert str(out) in capsys.readouterr().out

    config = load_config(out, environ={})
    assert config.gateway_id == "pi-kitchen"
    assert config.state_dir == tmp_path / "tesla-gateway-state"
    assert config.model_dirs == bundled_model_dirs()
    assert config.sensors.allow_unknown is False
    assert config.sensors.known == ["node-01", "node-02"]
    mqtt, node, pms = config.sources
    assert mqtt.kind == "mqtt"
    assert mqtt.topics == ["home/+/pm"]
    assert node.kind == "node"
    assert node.port == Path("/dev/ttyACM0")
    assert pms.kind == "pms5003"
    assert (pms.port, pms.sensor_id) == (Path("/dev/ttyUSB0"), "usb-pms")
    for broker in (mqtt.broker, config.publisher.broker):
        assert (broker.host, broker.port, broker.username) == ("mqtt.local", 8883, "tesla")
        assert broker.password_file == password
        assert broker.tls is not None
        assert broker.tls.ca_file == ca
    assert config.publisher.discovery is True
    text = out.read_text(encoding="utf-8")
    assert "secret" not in text  # the password stays in its file
    assert text.count("\n#") > 5  # commented

    assert main(["check-config", "--config", str(out)]) == 0
    checked = capsys.readouterr().out
    assert "model pm10: pm10-ispra-1min" in checked
    assert "model pm2_5: pm2_5-antwerp-1h" in checked
    # The covariate model is written beside the PM-only one, in its own slot.
    assert "model pm10 (pm10-ispra-1min-rh-temp): pm10-ispra-1min-rh-temp" in checked
    assert "channels pm10, rh, temp_c" in checked


def test_defaults_give_a_local_broker_and_the_bundled_pm10_model(tmp_path: Path) -> None:
    out = tmp_path / "gateway.toml"
    assert main(["init", "--out", str(out)]) == 0
    config = load_config(out, environ={})
    bundled = bundled_model_dirs()
    assert config.model_dirs == {
        "pm10": bundled["pm10"],
        "pm10-ispra-1min-rh-temp": bundled["pm10-ispra-1min-rh-temp"],
    }
    assert bundled["pm10"].name == "pm10-ispra-1min"  # the PM-only model is the feature's first
    assert (config.publisher.broker.host, config.publisher.broker.port) == ("127.0.0.1", 1883)
    assert config.sensors.allow_unknown is True
    assert [source.kind for source in config.sources] == ["mqtt"]
    # The fleet sources' distinct default ids, and how to keep the old ones, are told.
    text = out.read_text(encoding="utf-8")
    assert 'sensor_id_prefix = "tasmota-", "esphome-", "airrohr-" by default' in text
    assert "sensor_id_conflict" in text


def test_init_does_not_overwrite_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "gateway.toml"
    out.write_text("# mine\n", encoding="utf-8")
    assert main(["init", "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err
    assert out.read_text(encoding="utf-8") == "# mine\n"
    assert main(["init", "--out", str(out), "--force"]) == 0
    assert set(load_config(out, environ={}).model_dirs) == {"pm10", "pm10-ispra-1min-rh-temp"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gateway.toml"]  # no leftovers


def test_init_writes_the_fleet_sources_asked_for(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each fleet kind from its flags, on init's broker, and check-config accepts the file
    (issue 27: init had no flag for them)."""
    out = tmp_path / "gateway.toml"
    args = ["init", "--out", str(out), "--broker-port", "1884"]
    args += ["--tasmota-topic", "tele/+/SENSOR", "--timezone", "Europe/Rome"]
    args += ["--esphome-node", "air-1", "--esphome-node", "air-2"]
    args += ["--esphome-channel", "pm_10=pm10", "--esphome-channel", "humidity=rh"]
    args += ["--sensor-community-listen", "8123"]
    args += ["--purpleair-url", "http://192.168.1.40/json", "--purpleair-url", "http://pa-2/json"]
    assert main(args) == 0
    config = load_config(out, environ={})
    mqtt, tasmota, esphome, airrohr, purpleair = config.sources
    assert mqtt.kind == "mqtt"
    assert tasmota.kind == "tasmota"
    assert (tasmota.topics, tasmota.timezone) == (["tele/+/SENSOR"], "Europe/Rome")
    assert esphome.kind == "esphome"
    assert esphome.topics == ["air-1/sensor/+/state", "air-2/sensor/+/state"]
    assert esphome.channels == {"pm_10": "pm10", "humidity": "rh"}
    for source in (tasmota, esphome):
        assert (source.broker.host, source.broker.port) == ("127.0.0.1", 1884)
    assert airrohr.kind == "sensor_community"
    assert (airrohr.host, airrohr.port, airrohr.path) == ("0.0.0.0", 8123, "/data.php")
    assert airrohr.pm_sensor == "PMS"  # what the bundled models learned, checked at start
    assert purpleair.kind == "purpleair"
    assert [unit.url for unit in purpleair.units] == [
        "http://192.168.1.40/json",
        "http://pa-2/json",
    ]
    assert purpleair.pm_kind == "atm"  # what the bundled models were trained on
    text = out.read_text(encoding="utf-8")
    assert "TelePeriod 60" in text
    capsys.readouterr()
    assert main(["check-config", "--config", str(out)]) == 0, capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--tasmota-topic", "tele/+/SENSOR"], "--tasmota-topic needs --timezone ZONE"),
        (["--tasmota-topic", "t/+/S", "--timezone", "Mars/Olympus"], "not an IANA time zone"),
        (["--esphome-node", "air"], "--esphome-node needs --esphome-channel"),
        (["--esphome-node", "air", "--esphome-channel", "pm10"], "expected OBJECT_ID=CHANNEL"),
        (["--esphome-channel", "pm_10=pm10"], "name the node"),
        (["--sensor-community-listen", "host:http"], "expected [HOST:]PORT"),
        (["--purpleair-url", "https://10.0.0.5/json"], "do not make a valid configuration"),
    ],
)
def test_init_names_the_fleet_flag_that_is_missing_or_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "gateway.toml"
    assert main(["init", "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_the_example_config_shows_every_fleet_source_commented() -> None:
    """Uncommenting a fleet block of deploy/gateway.example.toml gives a valid source."""
    text = (REPO / "deploy" / "gateway.example.toml").read_text(encoding="utf-8")
    kinds = re.findall(r'^# kind = "(\w+)"$', text, flags=re.MULTILINE)
    assert {"tasmota", "esphome", "sensor_community", "purpleair"} <= set(kinds)
    head = 'gateway_id = "gw"\nstate_dir = "s"\n[[models]]\nfeature = "pm10"\nmodel_dir = "m"\n'
    for block in re.findall(r"^(# \[\[sources\]\]\n(?:# .*\n)+)", text, flags=re.MULTILINE):
        uncommented = re.sub(r"^# ?", "", block, flags=re.MULTILINE)
        uncommented = re.sub(r"\s+#.*$", "", uncommented, flags=re.MULTILINE)
        config = GatewayConfig.model_validate(tomllib.loads(head + uncommented))
        assert len(config.sources) == 1


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--feature", "pm1"], "no bundled model calibrates pm1"),
        (["--sensor", "bad id"], "--sensor 'bad id' must match"),
        (["--pms5003", "/dev/ttyUSB0"], "expected SENSOR_ID=PORT"),
        (["--model-dir", "pm10"], "expected FEATURE=DIR"),
        (["--gateway-id", "a/b"], "--gateway-id 'a/b' must match"),
        (["--broker-port", "0"], "do not make a valid configuration"),
    ],
)
def test_init_refuses_answers_that_cannot_make_a_valid_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    out = tmp_path / "gateway.toml"
    assert main(["init", "--out", str(out), *flags]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written, no temporary file left


def test_model_dir_replaces_the_bundled_model(tmp_path: Path) -> None:
    out = tmp_path / "gateway.toml"
    mine = tmp_path / "my-pm1"
    assert main(["init", "--out", str(out), "--model-dir", f"pm1={mine}"]) == 0
    assert load_config(out, environ={}).model_dirs == {"pm1": mine}

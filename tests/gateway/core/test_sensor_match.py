"""A source delivering another sensor or value set than the model learned is refused at
check-config and at start, with the fix, unless the source accepts it (issue 27: PurpleAir's
default cf_1 values and Tasmota's SDS011 block fed a model trained on PMS5003 atm values).

Real model directories (tests/support/models.py) whose manifest names the training sensor, and
the CLI as a user runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tesla_gateway.contract.manifest import Manifest, load_manifest, write_manifest
from tesla_gateway.contract.sensor_kind import PMS5003_ATM, SensorKind
from tesla_gateway.daemon.cli import main
from tesla_gateway.sources.purpleair import PurpleAirSourceConfig
from tesla_gateway.sources.sensor_community import SensorCommunitySourceConfig
from tesla_gateway.sources.tasmota import TasmotaSourceConfig
from tests.support.models import ModelFactory

BASE = """
gateway_id = "gw-1"
state_dir = "state"
[[models]]
feature = "pm10"
model_dir = "models/pm10"
"""
PURPLEAIR = '[[sources]]\nkind = "purpleair"\n{extra}[[sources.units]]\nurl = "http://pa/json"\n'
TASMOTA_SDS = '[[sources]]\nkind = "tasmota"\ntimezone = "UTC"\nblock = "SDS0X1"\n{extra}'
AIRROHR = '[[sources]]\nkind = "sensor_community"\n{extra}'


@pytest.fixture
def model(tmp_path: Path, model_factory: ModelFactory) -> Path:
    """A pm10 model whose manifest says it learned PMS5003 atm values, as the bundled ones."""
    model_dir = tmp_path / "models" / "pm10"
    model_factory.copy(model_dir)
    declared = load_manifest(model_dir).model_copy(update={"sensor": PMS5003_ATM})
    write_manifest(model_dir, declared)
    return model_dir


def check(tmp_path: Path, sources: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    config = tmp_path / "gateway.toml"
    config.write_text(BASE + sources, encoding="utf-8")
    code = main(["check-config", "--config", str(config)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["run", "--config", str(tmp_path / "gateway.toml")])
    return code, capsys.readouterr().err


def test_purpleair_cf1_is_refused_at_check_config_and_start_with_the_fix(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(tmp_path, PURPLEAIR.format(extra=""), capsys)
    assert code == 2, out
    assert (
        "sources[0] (purpleair) sensor: REFUSED: delivers PMS5003 cf_1 values, the model was "
        'trained on PMS5003 atm (test-tesla): set pm_kind = "atm" on this source, or '
        "accept_sensor_mismatch = true"
    ) in out
    code, err = run(tmp_path, capsys)
    assert code == 2  # before any connection is tried
    assert "refusing to start: sources[0] (purpleair) sensor: delivers PMS5003 cf_1" in err

    code, out = check(tmp_path, PURPLEAIR.format(extra='pm_kind = "atm"\n'), capsys)
    assert code == 0, out
    assert "sources[0] (purpleair) sensor: delivers PMS5003 atm" in out


def test_accept_sensor_mismatch_starts_with_a_warning(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(tmp_path, PURPLEAIR.format(extra="accept_sensor_mismatch = true\n"), capsys)
    assert code == 0, out
    assert "sources[0] (purpleair) sensor: WARNING: delivers PMS5003 cf_1 values" in out
    assert "(accepted: accept_sensor_mismatch = true)" in out


def test_a_tasmota_sds011_block_is_not_taken_for_a_pms5003(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(tmp_path, TASMOTA_SDS.format(extra=""), capsys)
    assert code == 2, out
    assert (
        "delivers SDS011 values, the model was trained on PMS5003 atm (test-tesla): calibrate "
        "it with a model trained on SDS011, or accept_sensor_mismatch = true"
    ) in out
    # A source that says what it delivers is believed.
    declared = TASMOTA_SDS.format(extra='delivers = { model = "PMS5003", values = "atm" }\n')
    assert check(tmp_path, declared, capsys)[0] == 0


def test_a_source_that_cannot_say_what_it_delivers_must_be_told(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """airrohr's pm_sensor 'auto' takes whichever sensor a station has (most carry an SDS011)."""
    code, out = check(tmp_path, AIRROHR.format(extra=""), capsys)
    assert code == 2, out
    assert "sources[0] (sensor_community) sensor: REFUSED: does not say what it delivers" in out
    assert "set pm_sensor to the stations' PM sensor (PMS, SDS, NPM, SPS30, IPS)" in out
    assert check(tmp_path, AIRROHR.format(extra='pm_sensor = "PMS"\n'), capsys)[0] == 0
    code, out = check(tmp_path, AIRROHR.format(extra='pm_sensor = "SDS"\n'), capsys)
    assert code == 2 and "delivers SDS011 values" in out


def test_a_model_that_does_not_name_its_sensor_is_told_not_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    undeclared = load_manifest(model).model_copy(update={"sensor": None})
    write_manifest(model, undeclared)
    code, out = check(tmp_path, PURPLEAIR.format(extra=""), capsys)
    assert code == 0, out
    assert "model pm10 sensor: WARNING: test-tesla's manifest does not say which sensor" in out


def test_each_kind_declares_what_its_settings_deliver() -> None:
    purpleair = PurpleAirSourceConfig.model_validate(
        {"kind": "purpleair", "units": [{"url": "http://pa/json"}]}
    )
    assert purpleair.sensor_delivered() == SensorKind(model="PMS5003", values="cf_1")
    tasmota = TasmotaSourceConfig(kind="tasmota", timezone="UTC")
    assert tasmota.sensor_delivered() == PMS5003_ATM
    assert tasmota.model_copy(update={"block": "SDS0X1"}).sensor_delivered() == SensorKind(
        model="SDS011"
    )
    airrohr = SensorCommunitySourceConfig(kind="sensor_community")
    assert airrohr.sensor_delivered() is None
    assert airrohr.model_copy(update={"pm_sensor": "PMS"}).sensor_delivered() == PMS5003_ATM


def test_sensor_kinds_match_by_model_family_and_value_set() -> None:
    assert SensorKind(model="PMS5003T", values="atm").mismatch(PMS5003_ATM) is None
    assert SensorKind(model="pms5003", values="atm").mismatch(PMS5003_ATM) is None
    assert SensorKind(model="PMS5003", values="cf_1").mismatch(PMS5003_ATM) is not None
    assert SensorKind(model="PMS7003", values="atm").mismatch(PMS5003_ATM) is not None
    sds = SensorKind(model="SDS011")
    assert sds.mismatch(sds) is None
    assert PMS5003_ATM.mismatch(sds) is not None


def test_a_manifest_without_a_sensor_block_still_loads(model: Path) -> None:
    """Manifests written before the block existed (older releases) stay valid."""
    document = json.loads((model / "manifest.json").read_text(encoding="utf-8"))
    del document["sensor"]
    assert Manifest.model_validate(document).sensor is None

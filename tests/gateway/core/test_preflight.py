"""``check-config`` runs every start-up check ``run`` runs (tesla_gateway/daemon/preflight.py),
and says
"configuration OK" only when all pass; ``run`` refuses on the same fatal ones.

Exit codes: 0 all pass; 1 the daemon would start degraded (a model that would not serve, a state
directory it cannot write); 2 invalid, or the daemon would refuse to start.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tesla_gateway.daemon.cli import main
from tests.support.models import ModelFactory

BASE = """
gateway_id = "gw-1"
state_dir = "state"
[[models]]
feature = "{feature}"
model_dir = "models/pm10"
"""


def write(tmp_path: Path, text: str, feature: str = "pm10") -> Path:
    path = tmp_path / "gateway.toml"
    path.write_text(BASE.format(feature=feature) + text, encoding="utf-8")
    return path


@pytest.fixture
def model(tmp_path: Path, model_factory: ModelFactory) -> Path:
    model_dir = tmp_path / "models" / "pm10"
    model_factory.copy(model_dir)  # a pm10 model
    return model_dir


def check(config: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["check-config", *extra, "--config", str(config)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_all_checks_pass(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = check(write(tmp_path, ""), capsys)
    assert code == 0, out
    assert out.rstrip().endswith("configuration OK")
    assert "model pm10: test-tesla v1" in out and "state_dir" in out


def test_a_model_for_another_feature_is_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = check(write(tmp_path, "", feature="pm2_5"), capsys)
    assert code == 1
    assert "holds a pm10 model but is configured for pm2_5" in out
    assert "configuration OK" not in out
    assert "would start degraded" in out


def test_a_missing_model_path_is_refused_unless_models_are_skipped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path, "")
    code, out = check(config, capsys)
    assert code == 1
    assert "does not exist" in out and str(tmp_path / "models" / "pm10") in out
    assert "configuration OK" not in out
    code, out = check(config, capsys, "--skip-models")  # systemd's ExecStartPre
    assert code == 0, out
    assert "configuration OK (models not loaded: --skip-models)" in out


def test_an_unreadable_password_file_stops_check_config_and_run_alike(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(
        tmp_path,
        '[publisher.broker]\nusername = "gw"\npassword_file = "missing-secret"\n',
    )
    for extra in ((), ("--skip-models",)):
        code, out = check(config, capsys, *extra)
        assert code == 2
        assert "publisher.broker: REFUSED: mqtt password_file" in out
        assert "configuration OK" not in out and "would refuse to start" in out
    assert main(["run", "--config", str(config)]) == 2  # before any connection is tried
    err = capsys.readouterr().err
    assert "refusing to start: publisher.broker: mqtt password_file" in err


def test_an_unreadable_release_key_stops_check_config_and_run_alike(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path, '[ota]\npublic_key_file = "no-such-key.pub"\n')
    code, out = check(config, capsys, "--skip-models")
    assert code == 2
    assert "release key: REFUSED" in out and "no-such-key.pub" in out
    assert main(["run", "--config", str(config)]) == 2
    assert "refusing to start: release key" in capsys.readouterr().err


def test_missing_tls_files_are_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path, '[publisher.broker.tls]\nca_file = "no-ca.pem"\n')
    code, out = check(config, capsys, "--skip-models")
    assert code == 2
    assert "publisher.broker: REFUSED: tls files cannot be loaded" in out


def test_serial_ports_named_twice_are_refused_and_absent_ones_are_told(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = '[[sources]]\nkind = "node"\nport = "ttyNODE0"\n'
    code, out = check(write(tmp_path, one), capsys, "--skip-models")
    assert code == 0, out  # a USB node may be plugged in after the start
    assert "ttyNODE0: WARNING: not present now" in out
    twice = one + '[[sources]]\nkind = "pms5003"\nport = "ttyNODE0"\nsensor_id = "s"\n'
    code, out = check(write(tmp_path, twice), capsys, "--skip-models")
    assert code == 2
    assert "configured 2 times" in out


def test_a_state_dir_that_cannot_be_a_directory_is_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "blocker").write_text("a file where the state directory's parent should be")
    config = write(tmp_path, "").read_text().replace('"state"', '"blocker/state"')
    (tmp_path / "gateway.toml").write_text(config)
    code, out = check(tmp_path / "gateway.toml", capsys)
    assert code == 1
    assert "state_dir: REFUSED" in out and "is not a directory" in out
    code, out = check(tmp_path / "gateway.toml", capsys, "--skip-models")
    assert code == 0, out  # ExecStartPre: the daemon runs without a writable state_dir


def test_a_topic_without_the_sensor_id_level_is_refused(
    model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = '[[sources]]\nkind = "mqtt"\ntopics = ["sensors/{}"]\nsensor_id_topic_level = 2\n'
    code, out = check(write(tmp_path, source.format("+/raw")), capsys)
    assert code == 0, out  # sensors/<id>/raw has a level 2
    code, out = check(write(tmp_path, source.format("+")), capsys)
    assert code == 1
    assert "have no level 2" in out and "bad_sensor_id" in out
    code, out = check(write(tmp_path, source.format("#")), capsys)
    assert code == 0, out  # '#' may hold any number of levels

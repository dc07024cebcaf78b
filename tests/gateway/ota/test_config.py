"""The [ota] section: validated with the rest of the configuration, paths relative to the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tesla_gateway.daemon.config import load_config
from tesla_gateway.errors import ConfigError
from tesla_gateway.ota.errors import OtaError
from tesla_gateway.ota.release import load_public_key

BASE = """
gateway_id = "gw"
state_dir = "state"
[[models]]
feature = "pm10"
model_dir = "models/pm10"
"""


def test_public_key_path_is_relative_to_the_config_file(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(BASE + '[ota]\npublic_key_file = "keys/release_key.pub"\n', "utf-8")
    config = load_config(path, environ={})
    assert config.ota is not None
    assert config.ota.public_key_file == tmp_path / "keys" / "release_key.pub"
    assert config.ota.chunk_size == 256


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('releases_topic_prefix = "tesla/#"', "without wildcards"),
        ("chunk_size = 400", "must be at most 360"),
        ("unknown = 1", "unknown key"),
    ],
)
def test_invalid_ota_settings_name_the_key(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text(BASE + f'[ota]\npublic_key_file = "k.pub"\n{extra}\n', "utf-8")
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path, environ={})
    assert "ota." in str(caught.value)


def test_a_bad_key_file_is_reported_with_what_to_use(tmp_path: Path) -> None:
    key = tmp_path / "k.pub"
    with pytest.raises(OtaError, match="cannot read"):
        load_public_key(key)
    key.write_text("not hex")
    with pytest.raises(OtaError, match=r"\.pub file from keygen"):
        load_public_key(key)
    key.write_text("ab" * 31)
    with pytest.raises(OtaError, match="31 bytes"):
        load_public_key(key)

# Shared fixtures: a real mosquitto broker and re-pluggable pty serial ports (both from devkit),
# and the small-model factory from tests/support.
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from devkit.broker import Mosquitto
from devkit.pty import PtySerial
from devkit.wheel import build_wheel
from tests.support.models import model_factory  # noqa: F401


@pytest.fixture
def mosquitto(tmp_path: Path) -> Iterator[Mosquitto]:
    """A fresh broker per test, stopped afterwards whatever happens."""
    with Mosquitto(tmp_path / "mosquitto") as broker:
        yield broker


@pytest.fixture(scope="session")
def gateway_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The gateway's wheel as `make wheel` builds it (offline: this venv's setuptools), built
    once per session, alone in its folder."""
    return build_wheel(tmp_path_factory.mktemp("dist"), build_isolation=False)


@pytest.fixture
def pty_serial(tmp_path: Path) -> Iterator[PtySerial]:
    """A pluggable fake serial device at ``tmp_path / 'ttyNODE0'``."""
    with closing(PtySerial(tmp_path / "ttyNODE0")) as device:
        yield device


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--reliability-long``: the long form of tests/reliability (``make reliability``)."""
    parser.addoption(
        "--reliability-long",
        action="store_true",
        default=False,
        help="run the reliability scenarios in their long form (more faults, longer soak)",
    )

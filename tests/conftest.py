# Fixtures from tests/support (gateway I/O): real mosquitto broker, re-pluggable pty serial ports.
import pytest

from tests.support.models import model_factory  # noqa: F401
from tests.support.mosquitto import mosquitto  # noqa: F401
from tests.support.pty_serial import pty_serial  # noqa: F401


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--reliability-long``: the long form of tests/reliability (``make reliability``)."""
    parser.addoption(
        "--reliability-long",
        action="store_true",
        default=False,
        help="run the reliability scenarios in their long form (more faults, longer soak)",
    )

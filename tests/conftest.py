# Fixtures from tests/support (gateway I/O): real mosquitto broker, re-pluggable pty serial ports.
from tests.support.models import model_factory  # noqa: F401
from tests.support.mosquitto import mosquitto  # noqa: F401
from tests.support.pty_serial import pty_serial  # noqa: F401

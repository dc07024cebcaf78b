"""``make demo``: the real daemon calibrating a replayed slice of real co-location data.

A development-machine feature: it needs mosquitto (``make setup`` installs it) and, for the
plot, matplotlib from the ``train`` extra. It never imports TensorFlow; the daemon it runs is the
production one (``python -m tesla_gateway run``), fed by simulated Arduino nodes over MQTT and over
a
pty serial line.
"""

from devkit.errors import DevkitError

__all__ = ["DemoError"]


class DemoError(DevkitError):
    """The demo could not run; the message says what to install or check."""

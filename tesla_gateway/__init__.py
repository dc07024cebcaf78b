"""tesla-gateway: real-time calibration of low-cost particulate sensors.

The ``gateway`` package is the daemon that runs on a Raspberry Pi and the owner of the contract
shared with ``training/`` and the firmware: the model manifest, the time grid and gap policy, and
the wire formats. It never imports TensorFlow.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]

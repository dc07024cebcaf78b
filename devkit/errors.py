"""Errors of the development kit's harnesses; each message says what to install or check."""

from __future__ import annotations

__all__ = ["BrokerError", "DaemonExitedError", "DaemonTimeoutError", "DevkitError"]


class DevkitError(RuntimeError):
    """A harness (broker, daemon, pty) could not do its job."""


class BrokerError(DevkitError):
    """mosquitto is missing, exited at start or did not listen."""


class DaemonExitedError(DevkitError):
    """The gateway daemon child process exited while it was expected to run."""


class DaemonTimeoutError(DevkitError):
    """The gateway daemon did not reach the awaited state in time."""

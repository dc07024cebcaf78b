# The daemon fixture of the end-to-end tests (the broker, pty and model fixtures are global).
from tests.gateway.e2e.harness import daemons  # noqa: F401

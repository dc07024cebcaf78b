"""The process: composition root, ticker, configuration, CLI, preflight, systemd glue."""

"""Passwords kept out of the configuration: the first line of a file (e.g. a systemd secret)."""

from __future__ import annotations

from pathlib import Path

from tesla_gateway.errors import ConfigError

__all__ = ["read_password_file"]


def read_password_file(path: Path, setting: str) -> str:
    """The file's first line (empty for an empty file), read at each connect so a rotated
    password is used by the next one; ``setting`` names the key in the error, e.g.
    ``[cluster] password_file``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{setting} {path} cannot be read: {exc.strerror}") from exc
    return (text.splitlines() or [""])[0]

"""The version each model slot last switched to serving, kept across restarts: its floor.

Without it a restart forgets what served: an older signed release copied or installed into a
model directory is refused on reload ("older than the serving version") and then served by the
next start, which has nothing serving to compare with. The daemon therefore records, per slot,
the version of every model it switches to (a new start, a reload, an installed release) in
``<state_dir>/served-versions.json``, and a start or reload refuses a candidate below it
(:class:`tesla_gateway.models.watch.ModelSet`) unless ``[ota] allow_downgrade`` is set. Since a
lower version can only come to serve with that permission, the record is the highest version
the slot has served since the operator last allowed a rollback, which then sticks.

The entry of a slot holds its configured ``model_dir`` too and binds only that directory: a
slot pointed at another directory in the configuration is the operator's new choice, not a
copy, and starts a new record.

Each change is written to a temporary file, fsynced, renamed over the record and the directory
fsynced, so a power cut leaves the old record or the new one. A record that cannot be read at
start (damaged, not this format) is moved aside (:mod:`tesla_gateway.set_aside`, logged and
counted on the stats) and the start proceeds as a first start: every slot serves by the
ordinary rule and is recorded afresh. That is the safe choice because refusing instead would
turn a bit flip on the SD card into an outage of every feature, while it protects nothing: who
can damage the record can as well delete it, and a missing record is what a first start sees.
A record that cannot be written (disk full, read-only state directory) is logged
(``served_version_not_saved``) and kept in memory, so the floor still holds until the restart.
"""

from __future__ import annotations

import os
import secrets
import threading
from pathlib import Path
from typing import Final

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tesla_gateway.set_aside import SetAsideLog

__all__ = ["SERVED_FILENAME", "ServedVersions"]

SERVED_FILENAME: Final = "served-versions.json"
_FORMAT: Final = 1

_log = structlog.get_logger(__name__)


class _Entry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model_dir: str
    version: int = Field(ge=0)


class _Document(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    format: int = Field(ge=_FORMAT, le=_FORMAT)
    slots: dict[str, _Entry]


class ServedVersions:
    """Per slot, the version it last switched to serving; read at first use, then kept.

    ``path`` None keeps the record in memory only; ``read_only`` reads it and never writes or
    moves it (``check-config``, which must change nothing).
    """

    def __init__(
        self,
        path: Path | None,
        *,
        set_aside: SetAsideLog | None = None,
        read_only: bool = False,
    ) -> None:
        self.path = path
        self._set_aside = set_aside if set_aside is not None else SetAsideLog()
        self._read_only = read_only
        self._entries: dict[str, _Entry] | None = None  # None: not read yet
        self._lock = threading.Lock()

    def floor(self, slot_id: str, model_dir: Path) -> int | None:
        """The version ``slot_id`` last switched to from ``model_dir``, or None if unknown."""
        with self._lock:
            entry = self._read().get(slot_id)
        if entry is None or entry.model_dir != str(model_dir):
            return None
        return entry.version

    def record(self, slot_id: str, model_dir: Path, version: int) -> None:
        """``slot_id`` now serves ``version`` from ``model_dir``; durable before it returns."""
        entry = _Entry(model_dir=str(model_dir), version=version)
        with self._lock:
            entries = self._read()
            if entries.get(slot_id) == entry:
                return
            entries[slot_id] = entry
            if self.path is None or self._read_only:
                return
            document = _Document(format=_FORMAT, slots=dict(sorted(entries.items())))
            try:
                _write_durably(self.path, document.model_dump_json(indent=2).encode() + b"\n")
            except OSError as exc:
                _log.error(
                    "served_version_not_saved",
                    path=str(self.path),
                    slot_id=slot_id,
                    version=version,
                    error=exc.strerror or str(exc),
                )

    def _read(self) -> dict[str, _Entry]:
        """The record, read from the file at the first call (callers hold the lock)."""
        if self._entries is None:
            self._entries = {} if self.path is None else self._load(self.path)
        return self._entries

    def _load(self, path: Path) -> dict[str, _Entry]:
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return {}  # a first start
        except OSError as exc:
            return self._unreadable(path, f"cannot read it: {exc.strerror or exc}")
        try:
            return dict(_Document.model_validate_json(raw).slots)
        except ValidationError as exc:
            return self._unreadable(path, f"not a served-versions record: {exc.errors()[0]}")

    def _unreadable(self, path: Path, reason: str) -> dict[str, _Entry]:
        """Start without the record (the module docstring says why that is safe)."""
        if self._read_only:
            _log.warning("served_versions_unreadable", path=str(path), reason=reason)
        else:
            self._set_aside.set_aside(path, kind="served versions", reason=reason)
        return {}


def _write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that a crash leaves the old content or the new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with temp.open("wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        temp.replace(path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)

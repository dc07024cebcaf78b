"""Windows that survive restarts: one atomic snapshot file per feature under the state dir.

A snapshot is an ``.npz`` (NumPy arrays, no pickle) written to a temporary file, fsynced and
renamed over the previous one, so a crash leaves either the old or the new snapshot, never half
of one. At start a snapshot is restored only if the model's N, period and channels still match.
A snapshot that cannot be read is moved aside (``.corrupt-<timestamp>``) and counted; a state dir
that cannot be written (disk full, read-only) is reported and the daemon keeps running.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import structlog

from gateway.errors import GatewayError
from gateway.window_store import (
    ModelWindows,
    WindowGeometry,
    WindowState,
    WindowStore,
    WindowStoreError,
)

__all__ = ["FORMAT_VERSION", "StateStats", "StateStore"]

FORMAT_VERSION = 1
_ARRAYS = (
    "ring",
    "last_closed",
    "first_period",
    "last_obs_period",
    "last_obs_value",
    "open_period",
    "open_sum",
    "open_count",
    "pending_period",
)

_log = structlog.get_logger(__name__)


class _CorruptStateError(GatewayError):
    """A snapshot file exists but cannot be decoded."""


@dataclass(slots=True)
class StateStats:
    saves: int = 0
    save_failures: int = 0
    restored: int = 0
    incompatible: int = 0
    corrupt: int = 0
    last_error: str | None = None
    last_save_unix: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "saves": self.saves,
            "save_failures": self.save_failures,
            "restored": self.restored,
            "incompatible": self.incompatible,
            "corrupt": self.corrupt,
            "last_error": self.last_error,
            "last_save_unix": self.last_save_unix,
        }


class StateStore:
    """Saves and restores the window store under ``state_dir/windows``."""

    def __init__(self, state_dir: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.directory = state_dir / "windows"
        self.stats = StateStats()
        self._clock = clock

    def path_for(self, feature: str) -> Path:
        return self.directory / f"{feature}.npz"

    # -- saving -----------------------------------------------------------------------------

    def save_all(self, store: WindowStore) -> bool:
        """Snapshot every feature; False if any failed (already logged and counted)."""
        return self.write_snapshots(self.snapshot(store))

    def snapshot(self, store: WindowStore) -> list[tuple[str, WindowState]]:
        """Copies to write later (take them on the event loop, write them in a thread)."""
        return [(feature, windows.export_state()) for feature, windows in store.items()]

    def write_snapshots(self, snapshots: list[tuple[str, WindowState]]) -> bool:
        """Write copies from :meth:`snapshot`; False if any failed."""
        ok = True
        for feature, state in snapshots:
            ok = self.write(feature, state) and ok
        return ok

    def save(self, feature: str, windows: ModelWindows) -> bool:
        return self.write(feature, windows.export_state())

    def write(self, feature: str, state: WindowState) -> bool:
        """Atomically replace the feature's snapshot; OSErrors are logged and counted."""
        geometry = state.geometry
        meta = {
            "format_version": FORMAT_VERSION,
            "feature": feature,
            "window_length": geometry.window_length,
            "period_seconds": geometry.period_seconds,
            "channels": list(geometry.channels),
            "sensor_ids": state.sensor_ids,
            "open_seen": state.open_seen,
            "saved_at": self._clock(),
        }
        arrays = {name: getattr(state, name) for name in _ARRAYS}
        target = self.path_for(feature)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            handle, temp_name = tempfile.mkstemp(dir=self.directory, prefix=".tmp-", suffix=".npz")
            try:
                with os.fdopen(handle, "wb") as out:
                    np.savez(out, meta=np.array(json.dumps(meta)), **arrays)
                    out.flush()
                    os.fsync(out.fileno())
                Path(temp_name).replace(target)
            except BaseException:
                Path(temp_name).unlink(missing_ok=True)
                raise
            _fsync_directory(self.directory)
        except OSError as exc:
            self.stats.save_failures += 1
            self.stats.last_error = f"save {target}: {exc.strerror or exc}"
            _log.error(
                "state_save_failed",
                feature=feature,
                path=str(target),
                error=exc.strerror or str(exc),
                errno=exc.errno,
            )
            return False
        self.stats.saves += 1
        self.stats.last_save_unix = self._clock()
        return True

    # -- restoring --------------------------------------------------------------------------

    def restore(self, feature: str, geometry: WindowGeometry) -> ModelWindows | None:
        """The saved windows for ``feature`` if present, readable and of the same geometry."""
        path = self.path_for(feature)
        if not path.exists():
            return None
        try:
            meta, arrays = _read(path)
            mismatch = _mismatch(meta, feature, geometry)
            if mismatch:
                self.stats.incompatible += 1
                _log.warning("state_incompatible", feature=feature, path=str(path), reason=mismatch)
                return None
            sensor_ids = meta["sensor_ids"]
            open_seen = meta["open_seen"]
            if not isinstance(sensor_ids, list) or not isinstance(open_seen, list):
                raise _CorruptStateError("sensor_ids and open_seen must be lists")
            state = WindowState(
                geometry=geometry,
                sensor_ids=[str(s) for s in sensor_ids],
                open_seen=[[float(t) for t in seen] for seen in open_seen],
                **arrays,
            )
            windows = ModelWindows.from_state(state)
        except (_CorruptStateError, WindowStoreError, KeyError, TypeError, ValueError) as exc:
            self._set_aside(path, feature, exc)
            return None
        except OSError as exc:
            self.stats.last_error = f"read {path}: {exc.strerror or exc}"
            _log.error("state_read_failed", feature=feature, path=str(path), error=str(exc))
            return None
        self.stats.restored += 1
        _log.info(
            "state_restored",
            feature=feature,
            sensors=len(state.sensor_ids),
            saved_at=meta.get("saved_at"),
        )
        return windows

    def _set_aside(self, path: Path, feature: str, exc: Exception) -> None:
        self.stats.corrupt += 1
        self.stats.last_error = f"corrupt {path}: {exc}"
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self._clock()))
        aside = path.with_name(f"{path.name}.corrupt-{stamp}")
        try:
            path.replace(aside)
        except OSError as move_error:
            _log.error(
                "state_corrupt",
                feature=feature,
                path=str(path),
                error=str(exc),
                set_aside=None,
                move_error=str(move_error),
            )
            return
        _log.error(
            "state_corrupt", feature=feature, path=str(path), error=str(exc), set_aside=str(aside)
        )


def _read(path: Path) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    try:
        with path.open("rb") as handle, np.load(handle, allow_pickle=False) as data:
            meta = json.loads(str(data["meta"]))
            arrays = {name: np.array(data[name]) for name in _ARRAYS}
    except (zipfile.BadZipFile, EOFError, json.JSONDecodeError) as exc:
        raise _CorruptStateError(f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise _CorruptStateError("unknown snapshot format")
    return meta, arrays


def _mismatch(meta: dict[str, object], feature: str, geometry: WindowGeometry) -> str | None:
    saved = (meta.get("feature"), meta.get("window_length"), meta.get("period_seconds"))
    current = (feature, geometry.window_length, geometry.period_seconds)
    if saved != current:
        return f"saved (feature, N, period) {saved} differs from the model's {current}"
    if meta.get("channels") != list(geometry.channels):
        return f"saved channels {meta.get('channels')} differ from {list(geometry.channels)}"
    return None


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

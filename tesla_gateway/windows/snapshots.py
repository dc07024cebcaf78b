"""Windows that survive restarts: one atomic snapshot file per feature under the state dir.

A snapshot is an ``.npz`` (NumPy arrays, no pickle) written to a temporary file, fsynced and
renamed over the previous one, so a crash leaves either the old or the new snapshot, never half
of one. At start a snapshot is restored only if the model's N, period and channels still match.
A snapshot that cannot be decoded, whatever is wrong with it, is moved aside
(``.corrupt-<timestamp>``, :mod:`tesla_gateway.set_aside`), logged and counted, and the
feature starts
with empty windows: restoring is total, so a damaged file can never stop the daemon from
starting. A state dir that cannot be written (disk full, read-only) is reported and the daemon
keeps running.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np
import structlog

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import SENSOR_ID_PATTERN
from tesla_gateway.contract.stuck import RUN_CAP
from tesla_gateway.contract.time_of_day import is_hour_channel
from tesla_gateway.errors import GatewayError
from tesla_gateway.set_aside import SetAsideLog
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.state import (
    NEWER_ARRAYS,
    STATE_ARRAYS,
    WAITING_ARRAYS,
    WindowState,
    WindowStoreError,
    waiting_as_arrays,
    waiting_from_arrays,
)
from tesla_gateway.windows.store import WindowStore

__all__ = [
    "FORMAT_VERSION",
    "CorruptSnapshotError",
    "StateStats",
    "StateStore",
    "state_arrays",
    "window_state",
]

FORMAT_VERSION = 1

_log = structlog.get_logger(__name__)


class CorruptSnapshotError(GatewayError):
    """A snapshot of the windows (a file, or a cluster partition's) cannot be decoded."""


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

    def __init__(
        self,
        state_dir: Path,
        *,
        clock: Callable[[], float] = time.time,
        set_aside: SetAsideLog | None = None,
    ) -> None:
        self.directory = state_dir / "windows"
        self.stats = StateStats()
        self._clock = clock
        self.set_aside = set_aside if set_aside is not None else SetAsideLog(clock=clock)

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
            # runs of sensors not back since a model swap: [sensor id, mean, run length]
            "carried_runs": [[k, v, r] for k, (v, r) in state.carried.items()],
        }
        arrays = {name: getattr(state, name) for name in STATE_ARRAYS}
        meta["waiting_sensor_ids"], waiting = waiting_as_arrays(state.waiting, geometry)
        arrays |= waiting
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
            state = window_state(meta, arrays, geometry)
            windows = ModelWindows.from_state(state)
        except (CorruptSnapshotError, WindowStoreError) as exc:
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
        self.set_aside.set_aside(path, kind=f"window snapshot {feature}", reason=str(exc))


_ZIP_MAGIC = b"PK\x03\x04"
_META_KEYS = {"format_version", "feature", "window_length", "period_seconds", "channels"}


def _read(path: Path) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """The snapshot's meta and arrays; :class:`CorruptSnapshotError` for anything undecodable.

    An OSError opening the file (permissions, a directory in its place) passes through: that is
    not the file's fault. Once open, any failure to read it (EIO included) means its bytes
    are damaged: corrupt. Arrays are read from the file, not from a copy of it in memory.
    """
    with path.open("rb") as handle:
        try:
            if handle.read(len(_ZIP_MAGIC)) != _ZIP_MAGIC:
                raise CorruptSnapshotError("not a snapshot: no .npz (zip) header")
            handle.seek(0)
            meta_text, arrays = _parse_npz(handle)
        except CorruptSnapshotError:
            raise
        # zipfile and numpy's .npy header parser raise on damaged bytes whatever their code
        # meets: BadZipFile, NotImplementedError (a compression method flipped),
        # tokenize.TokenError and SyntaxError (the header dict), UnicodeDecodeError, zlib.error,
        # struct.error, EOFError, OSError (a seek before the start), KeyError, OverflowError,
        # MemoryError (a shape flipped huge) ... (tests/reliability/test_fuzz_state_files.py).
        # The bytes are damaged whichever it is, so each becomes one corrupt-snapshot error,
        # named by type, that sets the file aside.
        except Exception as exc:  # see above; reported, counted, set aside
            raise CorruptSnapshotError(
                f"undecodable snapshot: {type(exc).__name__}: {exc}"
            ) from exc
    try:
        meta = json.loads(meta_text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise CorruptSnapshotError(f"snapshot meta is not JSON: {exc}") from exc
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise CorruptSnapshotError("unknown snapshot format")
    if not meta.keys() >= _META_KEYS:
        raise CorruptSnapshotError(f"snapshot meta lacks {sorted(_META_KEYS - meta.keys())}")
    return meta, arrays


def _parse_npz(handle: BinaryIO) -> tuple[str, dict[str, np.ndarray]]:
    """Decode the archive strictly: no pickles, the expected members, dtypes and ranks."""
    with np.load(handle, allow_pickle=False) as data:
        if "meta" not in data.files:
            raise CorruptSnapshotError("snapshot lacks arrays ['meta']")
        meta = data["meta"]
        if meta.dtype.kind != "U" or meta.ndim != 0:
            raise CorruptSnapshotError(f"snapshot meta has dtype {meta.dtype}, shape {meta.shape}")
        return str(meta), state_arrays(data)


def state_arrays(data: Mapping[str, np.ndarray], prefix: str = "") -> dict[str, np.ndarray]:
    """A state's arrays stored as ``<prefix><name>``, checked for presence and dtype kind
    (:class:`CorruptSnapshotError`); the waiting periods' arrays and the frozen-sensor runs
    where present (snapshots written before they were kept have none)."""
    missing = [n for n in STATE_ARRAYS if prefix + n not in data and n not in NEWER_ARRAYS]
    if missing:
        raise CorruptSnapshotError(f"snapshot lacks arrays {missing}")
    arrays: dict[str, np.ndarray] = {}
    for name, kind in STATE_ARRAYS.items():
        if prefix + name not in data:
            continue  # a newer array an older snapshot lacks
        array = np.asarray(data[prefix + name])
        if array.dtype.kind != kind:
            raise CorruptSnapshotError(f"snapshot array {name} has dtype {array.dtype}")
        arrays[name] = array
    arrays |= {
        name: np.asarray(data[prefix + name]) for name in WAITING_ARRAYS if prefix + name in data
    }
    return arrays


def window_state(
    meta: Mapping[str, object], arrays: Mapping[str, np.ndarray], geometry: WindowGeometry
) -> WindowState:
    """A state from a snapshot's meta (sensor ids, open periods' timestamps, waiting periods'
    sensors) and :func:`state_arrays`; :class:`CorruptSnapshotError` for what no gateway
    wrote (an invalid sensor id, a timestamp that is not a number)."""
    sensor_ids = meta.get("sensor_ids")
    open_seen = meta.get("open_seen")
    if not isinstance(sensor_ids, list) or not all(
        isinstance(s, str) and SENSOR_ID_PATTERN.fullmatch(s) for s in sensor_ids
    ):
        raise CorruptSnapshotError("snapshot sensor_ids must be a list of valid sensor ids")
    if not isinstance(open_seen, list) or not all(
        isinstance(seen, list) and all(_is_number(t) for t in seen) for seen in open_seen
    ):
        raise CorruptSnapshotError("snapshot open_seen must be lists of timestamps")
    waiting_ids = meta.get("waiting_sensor_ids", [])
    if not isinstance(waiting_ids, list) or not all(
        isinstance(s, str) and SENSOR_ID_PATTERN.fullmatch(s) for s in waiting_ids
    ):
        raise CorruptSnapshotError("snapshot waiting_sensor_ids must be a list of valid sensor ids")
    if waiting_ids and not all(n in arrays or n in NEWER_ARRAYS for n in WAITING_ARRAYS):
        raise CorruptSnapshotError("snapshot names waiting periods but lacks their arrays")
    return WindowState(
        geometry=geometry,
        sensor_ids=list(sensor_ids),
        open_seen=[[float(t) for t in seen] for seen in open_seen],
        ring=arrays["ring"],
        last_closed=arrays["last_closed"],
        first_period=arrays["first_period"],
        last_obs_period=arrays["last_obs_period"],
        last_obs_value=arrays["last_obs_value"],
        open_period=arrays["open_period"],
        open_sum=arrays["open_sum"],
        open_count=arrays["open_count"],
        pending_period=arrays["pending_period"],
        waiting=waiting_from_arrays(waiting_ids, arrays, geometry) if waiting_ids else [],
        carried=_carried_runs(meta.get("carried_runs", [])),  # older snapshots: none
        **{name: arrays[name] for name in ("run_value", "run_length") if name in arrays},
    )


def _carried_runs(entries: object) -> dict[str, tuple[float, int]]:
    """The meta's carried runs ([sensor id, mean, run length] each), a run clipped at
    :data:`RUN_CAP` here (JSON integers have no bound); its sign is checked with the state's
    other runs."""
    if not isinstance(entries, list) or not all(
        isinstance(entry, list)
        and len(entry) == 3
        and isinstance(entry[0], str)
        and SENSOR_ID_PATTERN.fullmatch(entry[0])
        and _is_number(entry[1])
        and isinstance(entry[2], int)
        and not isinstance(entry[2], bool)
        for entry in entries
    ):
        raise CorruptSnapshotError("snapshot carried_runs must be [sensor id, mean, run] lists")
    return {sensor_id: (float(value), min(run, RUN_CAP)) for sensor_id, value, run in entries}


def _is_number(value: object) -> bool:
    """A JSON number that fits a float (json gives bool for true/false: not a timestamp)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return abs(value) < 1e300


def _mismatch(meta: dict[str, object], feature: str, geometry: WindowGeometry) -> str | None:
    saved = (meta.get("feature"), meta.get("window_length"), meta.get("period_seconds"))
    current = (feature, geometry.window_length, geometry.period_seconds)
    if saved != current:
        return f"saved (feature, N, period) {saved} differs from the model's {current}"
    channels = meta.get("channels")
    read = (
        [c for c in channels if not is_hour_channel(c)] if isinstance(channels, list) else channels
    )
    if read != list(geometry.read_channels):  # the hour channels are derived, not saved
        return f"saved channels {channels} differ from {list(geometry.channels)}"
    return None


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

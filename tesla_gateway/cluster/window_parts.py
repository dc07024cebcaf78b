"""A partition's share of the windows: cut out of a model's state, carried as bytes, merged in.

A snapshot of one partition holds, per model slot, the rows of that partition's sensors (the
same :class:`WindowState` the local snapshot files hold) and the stream sequence the windows
cover. It is an ``.npz`` (NumPy arrays, no pickle) with the strings in a JSON meta (as uint8
bytes), so a gateway reads only numbers and text from the bucket.
"""

from __future__ import annotations

import contextlib
import io
import json
import zipfile
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.time_of_day import is_hour_channel
from tesla_gateway.windows.snapshots import CorruptSnapshotError, state_arrays, window_state
from tesla_gateway.windows.state import STATE_ARRAYS, WindowState, waiting_as_arrays

__all__ = [
    "CorruptSnapshotError",
    "PartitionSnapshot",
    "decode",
    "encode",
    "merge",
    "remove",
    "sequence_of",
    "subset",
]

FORMAT = 1


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """One partition's windows per slot and the last stream sequence they hold; ``mismatched``:
    the slots decode skipped as their geometry differs from this gateway's model."""

    sequence: int
    states: Mapping[str, WindowState]
    mismatched: tuple[str, ...] = ()


def subset(state: WindowState, sensor_ids: Collection[str]) -> WindowState:
    """The rows of ``sensor_ids`` (those present) as a state of their own."""
    rows = [row for row, sensor_id in enumerate(state.sensor_ids) if sensor_id in sensor_ids]
    return _rows(state, rows, {k: v for k, v in state.carried.items() if k in sensor_ids})


def remove(state: WindowState, sensor_ids: Collection[str]) -> WindowState:
    """``state`` without the rows of ``sensor_ids``."""
    rows = [row for row, sensor_id in enumerate(state.sensor_ids) if sensor_id not in sensor_ids]
    return _rows(state, rows, {k: v for k, v in state.carried.items() if k not in sensor_ids})


def merge(base: WindowState, extra: WindowState) -> WindowState:
    """``base`` with ``extra``'s rows, which replace base's rows of the same sensors."""
    kept = remove(base, set(extra.sensor_ids))
    arrays: dict[str, Any] = {
        name: np.concatenate([getattr(kept, name), getattr(extra, name)]) for name in STATE_ARRAYS
    }
    return WindowState(
        geometry=base.geometry,
        sensor_ids=[*kept.sensor_ids, *extra.sensor_ids],
        **arrays,
        open_seen=[*kept.open_seen, *extra.open_seen],
        waiting=[*kept.waiting, *extra.waiting],
        carried={**kept.carried, **extra.carried},  # frozen runs of sensors not back since a swap
    )


def _rows(
    state: WindowState, rows: list[int], carried: dict[str, tuple[float, int]]
) -> WindowState:
    index = np.asarray(rows, dtype=np.intp)
    sensor_ids = [state.sensor_ids[row] for row in rows]
    chosen = set(sensor_ids)
    arrays: dict[str, Any] = {
        name: np.asarray(getattr(state, name))[index].copy() for name in STATE_ARRAYS
    }
    return WindowState(
        geometry=state.geometry,
        sensor_ids=sensor_ids,
        **arrays,
        open_seen=[list(state.open_seen[row]) for row in rows],
        waiting=[item for item in state.waiting if item.sensor_id in chosen],
        carried=carried,
    )


def encode(snapshot: PartitionSnapshot) -> bytes:
    """The bytes of a partition snapshot (see the module's docstring)."""
    arrays: dict[str, np.ndarray] = {}
    slots: dict[str, object] = {}
    for index, (slot, state) in enumerate(snapshot.states.items()):
        geometry = state.geometry
        waiting_ids, waiting = waiting_as_arrays(state.waiting, geometry)
        slots[slot] = {
            "index": index,
            "sensor_ids": state.sensor_ids,
            "waiting_sensor_ids": waiting_ids,
            "window_length": geometry.window_length,
            "period_seconds": geometry.period_seconds,
            "channels": list(geometry.channels),
            "open_seen": state.open_seen,
        }
        for name in STATE_ARRAYS:
            arrays[f"s{index}_{name}"] = np.asarray(getattr(state, name))
        for name, array in waiting.items():
            arrays[f"s{index}_{name}"] = array
    meta = {"format": FORMAT, "sequence": snapshot.sequence, "slots": slots}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def decode(
    blob: bytes, geometries: Mapping[str, WindowGeometry], *, max_bytes: int
) -> PartitionSnapshot:
    """A snapshot's states for the slots whose geometry still matches ``geometries``.

    Total, like the snapshot files' reading (:mod:`tesla_gateway.windows.snapshots`, whose
    checks it shares): bytes no gateway wrote raise :class:`CorruptSnapshotError` whatever is
    wrong with them, and an archive declaring more than ``max_bytes`` is refused before any of
    it is inflated.
    """
    with _undecodable():
        return _decode(blob, geometries, max_bytes)


def sequence_of(blob: bytes, *, max_bytes: int) -> int:
    """The stream sequence a snapshot covers, reading only its meta."""
    with _undecodable(), _archive(blob, max_bytes) as archive:
        return _sequence(_meta(archive))


@contextlib.contextmanager
def _undecodable() -> Iterator[None]:
    """zipfile, numpy's .npy reader and json raise whatever damaged bytes make them meet
    (EOFError, BadZipFile, RecursionError, ... tests/cluster/test_snapshot_attacks.py): each
    is one undecodable snapshot, named by its type."""
    try:
        yield
    except CorruptSnapshotError:
        raise
    except Exception as exc:
        raise CorruptSnapshotError(
            f"undecodable partition snapshot: {type(exc).__name__}: {exc}"
        ) from exc


def _archive(blob: bytes, max_bytes: int) -> np.lib.npyio.NpzFile:
    """The archive, once its size and the sizes its members declare are within bounds (the
    zip reader inflates no member past its declared size)."""
    if len(blob) > max_bytes:
        raise CorruptSnapshotError(f"snapshot of {len(blob)} bytes, over the {max_bytes} limit")
    with zipfile.ZipFile(io.BytesIO(blob)) as members:
        declared = sum(info.file_size for info in members.infolist())
    if declared > max_bytes:
        raise CorruptSnapshotError(
            f"snapshot declares {declared} bytes inflated, over the {max_bytes} limit"
        )
    npz: np.lib.npyio.NpzFile = np.load(io.BytesIO(blob), allow_pickle=False)
    return npz


def _meta(archive: np.lib.npyio.NpzFile) -> dict[str, Any]:
    raw = archive["meta"]
    if raw.dtype != np.uint8 or raw.ndim != 1:
        raise CorruptSnapshotError(f"snapshot meta has dtype {raw.dtype}, shape {raw.shape}")
    meta = json.loads(raw.tobytes())
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CorruptSnapshotError(f"not a partition snapshot of format {FORMAT}")
    if not isinstance(meta.get("slots"), dict):
        raise CorruptSnapshotError("snapshot slots must be an object")
    return meta


def _sequence(meta: Mapping[str, Any]) -> int:
    sequence = meta.get("sequence")
    if isinstance(sequence, bool) or not isinstance(sequence, int) or sequence < 0:
        raise CorruptSnapshotError(f"snapshot sequence {sequence!r} is not a stream sequence")
    return sequence


def _decode(
    blob: bytes, geometries: Mapping[str, WindowGeometry], max_bytes: int
) -> PartitionSnapshot:
    with _archive(blob, max_bytes) as archive:
        meta = _meta(archive)
        sequence = _sequence(meta)
        states: dict[str, WindowState] = {}
        mismatched: list[str] = []
        for slot, info in meta["slots"].items():
            if not isinstance(info, dict):
                raise CorruptSnapshotError(f"snapshot slot {slot!r} is not an object")
            geometry = geometries.get(slot)
            if geometry is None or (
                geometry.window_length != info.get("window_length")
                or geometry.period_seconds != info.get("period_seconds")
                or _read_channels(info.get("channels")) != list(geometry.read_channels)
            ):
                if geometry is not None:
                    mismatched.append(str(slot))
                continue  # a model that changed since: its windows start anew
            index = info.get("index")
            if isinstance(index, bool) or not isinstance(index, int):
                raise CorruptSnapshotError(f"snapshot slot {slot!r} has index {index!r}")
            state = window_state(info, state_arrays(archive, f"s{index}_"), geometry)
            state.check_shapes()
            states[slot] = state
    return PartitionSnapshot(sequence=sequence, states=states, mismatched=tuple(mismatched))


def _read_channels(saved: object) -> object:
    """The saved channels less the derived hour ones (a model adding the hour keeps them)."""
    return [c for c in saved if not is_hour_channel(c)] if isinstance(saved, list) else saved

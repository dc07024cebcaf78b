"""A partition's share of the windows: cut out of a model's state, carried as bytes, merged in.

A snapshot of one partition holds, per model slot, the rows of that partition's sensors (the
same :class:`WindowState` the local snapshot files hold) and the stream sequence the windows
cover. It is an ``.npz`` (NumPy arrays, no pickle) with the strings in one JSON array, so a
gateway reads only numbers and text from the bucket.
"""

from __future__ import annotations

import io
import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import numpy as np

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.windows.state import (
    WAITING_ARRAYS,
    WindowState,
    waiting_as_arrays,
    waiting_from_arrays,
)

__all__ = ["PartitionSnapshot", "decode", "encode", "merge", "remove", "subset"]

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
FORMAT = 1


@dataclass(frozen=True, slots=True)
class PartitionSnapshot:
    """One partition's windows per slot and the last stream sequence they hold."""

    sequence: int
    states: Mapping[str, WindowState]


def subset(state: WindowState, sensor_ids: Collection[str]) -> WindowState:
    """The rows of ``sensor_ids`` (those present) as a state of their own."""
    rows = [row for row, sensor_id in enumerate(state.sensor_ids) if sensor_id in sensor_ids]
    return _rows(state, rows)


def remove(state: WindowState, sensor_ids: Collection[str]) -> WindowState:
    """``state`` without the rows of ``sensor_ids``."""
    rows = [row for row, sensor_id in enumerate(state.sensor_ids) if sensor_id not in sensor_ids]
    return _rows(state, rows)


def merge(base: WindowState, extra: WindowState) -> WindowState:
    """``base`` with ``extra``'s rows, which replace base's rows of the same sensors."""
    kept = remove(base, set(extra.sensor_ids))
    pending = [kept.pending_period, extra.pending_period]
    return WindowState(
        geometry=base.geometry,
        sensor_ids=[*kept.sensor_ids, *extra.sensor_ids],
        **{
            name: np.concatenate([getattr(kept, name), getattr(extra, name)])
            for name in _ARRAYS
            if name != "pending_period"
        },
        open_seen=[*kept.open_seen, *extra.open_seen],
        pending_period=np.concatenate(pending).astype(np.int64),
        waiting=[*kept.waiting, *extra.waiting],
    )


def _rows(state: WindowState, rows: list[int]) -> WindowState:
    index = np.asarray(rows, dtype=np.intp)
    sensor_ids = [state.sensor_ids[row] for row in rows]
    chosen = set(sensor_ids)
    return WindowState(
        geometry=state.geometry,
        sensor_ids=sensor_ids,
        **{name: np.asarray(getattr(state, name))[index].copy() for name in _ARRAYS},
        open_seen=[list(state.open_seen[row]) for row in rows] if state.open_seen else [],
        waiting=[item for item in state.waiting if item.sensor_id in chosen],
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
        for name in _ARRAYS:
            arrays[f"s{index}_{name}"] = np.asarray(getattr(state, name))
        for name, array in waiting.items():
            arrays[f"s{index}_{name}"] = array
    meta = {"format": FORMAT, "sequence": snapshot.sequence, "slots": slots}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def decode(blob: bytes, geometries: Mapping[str, WindowGeometry]) -> PartitionSnapshot:
    """A snapshot's states for the slots whose geometry still matches ``geometries``; raises
    ValueError (or KeyError) on bytes that are not a snapshot of this format."""
    with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
        meta = json.loads(archive["meta"].tobytes())
        if meta.get("format") != FORMAT:
            raise ValueError(f"snapshot format {meta.get('format')!r}, expected {FORMAT}")
        states: dict[str, WindowState] = {}
        for slot, info in meta["slots"].items():
            geometry = geometries.get(slot)
            if geometry is None or (
                geometry.window_length != info["window_length"]
                or geometry.period_seconds != info["period_seconds"]
                or list(geometry.channels) != info["channels"]
            ):
                continue  # a model that changed since: its windows start anew
            index = info["index"]
            state = WindowState(
                geometry=geometry,
                sensor_ids=[str(sensor_id) for sensor_id in info["sensor_ids"]],
                **{name: archive[f"s{index}_{name}"] for name in _ARRAYS},
                open_seen=[[float(t) for t in row] for row in info["open_seen"]],
                waiting=waiting_from_arrays(
                    [str(sensor_id) for sensor_id in info.get("waiting_sensor_ids", [])],
                    {name: archive[f"s{index}_{name}"] for name in WAITING_ARRAYS},
                    geometry,
                )
                if info.get("waiting_sensor_ids")
                else [],
            )
            state.check_shapes()
            states[slot] = state
    return PartitionSnapshot(sequence=int(meta["sequence"]), states=states)

"""Partition snapshots an attacker (or a damaged bucket) wrote: decoding is total.

Before, one such value in the bucket escaped ``window_parts.decode`` as EOFError, BadZipFile,
AttributeError, TypeError or RecursionError past the member's handler and stopped every gateway
that took the partition, restart after restart; a well-formed one installed a sensor id no
source accepts; an archive was inflated whatever size it declared. Now each is one
:class:`CorruptSnapshotError` (the member then starts the partition cold: test_snapshot_store).
No server is needed: these are bytes.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tesla_gateway.cluster import window_parts
from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.series import GapPolicy
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.snapshots import CorruptSnapshotError

_GEOMETRY = WindowGeometry(4, 60, ("pm10",), GapPolicy(max_interpolated_periods=2))
_MAX = 1 << 20


def _valid() -> bytes:
    windows = ModelWindows(_GEOMETRY)
    for minute in range(6):
        windows.add(Reading("a", 6000.0 + minute * 60 + 5, {"pm10": float(minute)}), arrival=0.0)
    state = windows.export_state()
    return window_parts.encode(window_parts.PartitionSnapshot(7, {"pm10": state}))


def _with_meta(change: Callable[[dict[str, Any]], object]) -> bytes:
    """A valid snapshot whose meta ``change`` rewrote (its value replaces the meta if not None)."""
    with np.load(io.BytesIO(_valid()), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(arrays["meta"].tobytes())
    replaced = change(meta)
    text = json.dumps(meta if replaced is None else replaced)
    arrays["meta"] = np.frombuffer(text.encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _plain_npy() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.arange(4))
    return buffer.getvalue()


def _nested_meta() -> bytes:
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    buffer = io.BytesIO()
    np.savez(buffer, meta=np.frombuffer(deep, dtype=np.uint8))
    return buffer.getvalue()


def _set_sensor(meta: dict[str, Any], sensor: object) -> None:
    """The one sensor renamed, in its row and its waiting periods."""
    slot = meta["slots"]["pm10"]
    slot["sensor_ids"] = [sensor]
    slot["waiting_sensor_ids"] = [sensor] * len(slot["waiting_sensor_ids"])


ATTACKS: dict[str, Callable[[], bytes]] = {
    "empty": lambda: b"",  # EOFError before
    "truncated": lambda: _valid()[:300],  # BadZipFile
    "meta-a-list": lambda: _with_meta(lambda meta: [meta]),  # AttributeError
    "slots-a-string": lambda: _with_meta(lambda meta: meta.update(slots="pm10")),
    "sequence-null": lambda: _with_meta(lambda meta: meta.update(sequence=None)),  # TypeError
    "sequence-a-string": lambda: _with_meta(lambda meta: meta.update(sequence="9")),
    "plain-npy": _plain_npy,  # TypeError (no archive)
    "nested-json": _nested_meta,  # RecursionError
    "slot-a-number": lambda: _with_meta(lambda meta: meta["slots"].update(pm10=3)),
    "index-null": lambda: _with_meta(lambda meta: meta["slots"]["pm10"].update(index=None)),
    "index-elsewhere": lambda: _with_meta(lambda meta: meta["slots"]["pm10"].update(index=5)),
    "open-seen-text": lambda: _with_meta(lambda meta: meta["slots"]["pm10"].update(open_seen="x")),
    "wildcard-sensor": lambda: _with_meta(lambda meta: _set_sensor(meta, "ev/+/#")),
    "sensor-a-number": lambda: _with_meta(lambda meta: _set_sensor(meta, 12)),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_an_undecodable_snapshot_raises_one_error(attack: str) -> None:
    blob = ATTACKS[attack]()
    with pytest.raises(CorruptSnapshotError):
        window_parts.decode(blob, {"pm10": _GEOMETRY}, max_bytes=_MAX)


def test_the_valid_snapshot_the_attacks_start_from_decodes() -> None:
    snapshot = window_parts.decode(_valid(), {"pm10": _GEOMETRY}, max_bytes=_MAX)
    assert snapshot.sequence == 7
    assert snapshot.states["pm10"].sensor_ids == ["a"]
    assert window_parts.sequence_of(_valid(), max_bytes=_MAX) == 7
    with pytest.raises(CorruptSnapshotError, match="sequence"):
        window_parts.sequence_of(ATTACKS["sequence-null"](), max_bytes=_MAX)


def test_a_zip_bomb_is_refused_by_its_declared_size() -> None:
    """A member that inflates to 64 times the limit, in a few kilobytes: refused unread."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("meta.npy", b"\0" * (64 * _MAX))
    blob = buffer.getvalue()
    assert len(blob) < _MAX // 16
    with pytest.raises(CorruptSnapshotError, match="declares"):
        window_parts.decode(blob, {"pm10": _GEOMETRY}, max_bytes=_MAX)


def test_a_snapshot_over_the_limit_is_refused() -> None:
    blob = _valid()
    with pytest.raises(CorruptSnapshotError, match="over the"):
        window_parts.decode(blob, {"pm10": _GEOMETRY}, max_bytes=len(blob) - 1)
    assert window_parts.decode(blob, {"pm10": _GEOMETRY}, max_bytes=len(blob)).sequence == 7

"""State files damaged on disk: a window snapshot, an outbox and a pairs file, each written by
the real code, then mutated (bit flips, zeroed 512-byte blocks, truncation, random garbage) and
read back by the code path the daemon takes at start. Zero exceptions may escape, an unreadable
snapshot or outbox must be set aside (``*.corrupt-<time>``), the outbox must work afterwards and
a restarted pairs writer must still append.

A few hundred seeded mutations each in ``make test``; thousands with ``--reliability-long``.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import shutil
import sqlite3
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from structlog.testing import capture_logs

from tesla_gateway.contract.geometry import WindowGeometry
from tesla_gateway.contract.manifest import load_manifest
from tesla_gateway.contract.readings import Reading
from tesla_gateway.contract.timefmt import iso8601
from tesla_gateway.monitor.pairs import PairRow, PairsWriter
from tesla_gateway.publish.outbox import Outbox
from tesla_gateway.publish.outbox_messages import OutboxMessage
from tesla_gateway.set_aside import SetAsideLog
from tesla_gateway.windows.ring import ModelWindows
from tesla_gateway.windows.snapshots import StateStore
from tesla_gateway.windows.state import NO_PERIOD, WAITING_ARRAYS
from tesla_gateway.windows.store import WindowStore
from tests.reliability.harness import DEFAULT_MODEL, report

pytestmark = pytest.mark.reliability

SHORT, LONG = 300, 3000
T0 = 1_800_000_000 // 60 * 60


def mutate(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """One seeded mutation of ``data`` (never the identity)."""
    kind = rng.choice(["bit_flips", "zero_block", "truncate", "garbage"])
    out = bytearray(data)
    if kind == "bit_flips":
        for _ in range(rng.randint(1, 8)):
            position = rng.randrange(len(out))
            out[position] ^= 1 << rng.randrange(8)
    elif kind == "zero_block":
        start = rng.randrange(0, len(out), 512) if rng.random() < 0.5 else rng.randrange(len(out))
        out[start : start + 512] = bytes(len(out[start : start + 512]))
    elif kind == "truncate":
        del out[rng.randrange(len(out)) :]
    else:
        start = rng.randrange(len(out))
        length = rng.randint(1, 256)
        out[start : start + length] = rng.randbytes(len(out[start : start + length]))
    if bytes(out) == data:
        out[0] ^= 0xFF
    return kind, bytes(out)


def run_mutations(
    count: int, seed: int, data: bytes, trial: Callable[[bytes], str]
) -> dict[str, object]:
    """Apply ``count`` mutations; ``trial`` returns an outcome name or raises (a failure)."""
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    uncaught: list[str] = []
    for index in range(count):
        kind, mutated = mutate(data, rng)
        kinds[kind] += 1
        try:
            outcomes[trial(mutated)] += 1
        except Exception as exc:  # noqa: BLE001  # the finding: collect, then fail below
            uncaught.append(f"#{index} {kind}: {type(exc).__name__}: {exc}")
    return {
        "mutations": count,
        "by_kind": dict(kinds),
        "outcomes": dict(outcomes),
        "uncaught": len(uncaught),
        "first_uncaught": uncaught[:5],
    }


# -- window snapshots ------------------------------------------------------------------------


def real_geometry() -> WindowGeometry:
    return WindowGeometry.from_manifest(load_manifest(DEFAULT_MODEL))


def real_snapshot(directory: Path, geometry: WindowGeometry) -> bytes:
    """A snapshot as the daemon writes it: 4 sensors, closed and open periods, a pending one."""
    store = WindowStore()
    store.ensure("pm10", geometry)
    period = geometry.period_seconds
    for sensor in range(4):
        for step in range(30):
            if step % 7 == 3:
                continue  # gaps: interpolated and carried state
            for offset in (5, 35):
                store.add(
                    Reading(f"node-{sensor}", T0 + step * period + offset, {"pm10": 20.0 + step}),
                    0.0,
                )
            if step < 25:
                store["pm10"].ready_windows()
    saver = StateStore(directory)
    assert saver.save_all(store)
    return saver.path_for("pm10").read_bytes()


def snapshot_trial(directory: Path, geometry: WindowGeometry) -> Callable[[bytes], str]:
    saver = StateStore(directory)
    path = saver.path_for("pm10")

    def trial(mutated: bytes) -> str:
        shutil.rmtree(directory / "windows", ignore_errors=True)
        path.parent.mkdir(parents=True)
        path.write_bytes(mutated)
        before = saver.set_aside.count
        restored = saver.restore("pm10", geometry)  # what WindowKeeper.sync_windows calls
        if restored is None:
            # unreadable: set aside (moved, counted), never left in place to fail again
            assert saver.set_aside.count == before + 1, "unrestorable snapshot not set aside"
            assert not path.exists()
            assert list(path.parent.glob("pm10.npz.corrupt-*"))
            return "set_aside"
        # restored: the windows must work (a reading in, windows out, published, saved)
        windows_work(restored, geometry, directory / "again")
        return "restored"

    return trial


def windows_work(restored: ModelWindows, geometry: WindowGeometry, directory: Path) -> None:
    """What the daemon does with restored windows: a reading in, a tick out whose periods are
    published as ISO-8601 times, a snapshot written and read back."""
    restored.add(Reading("node-0", T0 + 40 * geometry.period_seconds, {"pm10": 1.0}), 0.0)
    ready = restored.ready_windows()
    for period in ready.periods.tolist():
        iso8601(float(period * geometry.period_seconds))  # the message's period_start and ts
        iso8601(float((period + 1) * geometry.period_seconds))
    store = WindowStore()
    store.install("pm10", restored)
    saver = StateStore(directory)
    assert saver.save_all(store)
    assert saver.restore("pm10", geometry) is not None


def _odd_value(rng: random.Random, array: np.ndarray) -> np.ndarray:
    """``array`` with an odd dtype, shape or values: what a tampered or half-written file holds."""
    kind = rng.choice(["dtype", "shape", "values"])
    if kind == "dtype":
        dtype = rng.choice(["int8", "uint64", "float16", "float64", "complex64", "bool", "U3"])
        with np.errstate(all="ignore"):  # int8 wraps: odd values are the point
            return array.astype(dtype)
    if kind == "shape":
        return rng.choice(
            [
                array[:-1],
                np.concatenate([array, array[:1]]),
                array.reshape(-1),
                array[np.newaxis],
                np.asarray(array.ravel()[0]),
                np.empty((0,), dtype=array.dtype),
            ]
        )
    odd = array.copy()
    flat = odd.reshape(-1)
    position = rng.randrange(flat.size)
    if odd.dtype.kind == "f":
        flat[position] = rng.choice([math.nan, math.inf, -math.inf, -1.0, 1e38, 0.0])
    else:
        flat[position] = rng.choice(
            [NO_PERIOD, -1, 0, 2**62, np.iinfo(np.int64).max, int(flat[0]), int(flat[0]) + 10**6]
        )
    return odd


def _odd_ids(rng: random.Random, ids: list[str], all_ids: list[str]) -> object:
    return rng.choice(
        [
            [*ids[:-1], "ghost"],  # no window of its own
            [all_ids[0]] * len(ids),  # another sensor's periods
            ids[:-1],  # one short of the arrays
            [*ids, ids[-1]],  # one more than the arrays
            [],  # none, though the arrays hold some
            "x" * len(ids),  # a string, not a list
            [None] * len(ids),
            list(reversed(ids)),
        ]
    )


def test_window_snapshots_with_odd_waiting_periods_never_escape(
    tmp_path: Path, long_form: bool
) -> None:
    """The waiting periods' arrays rewritten inside a sound archive (a tampered or
    half-converted file the zip checksums pass): each restores into working windows or is set
    aside; no exception escapes, and no period reaches a tick that cannot be published."""
    geometry = real_geometry()
    data = real_snapshot(tmp_path / "origin", geometry)
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        arrays = {name: archive[name] for name in archive.files}
    meta = json.loads(str(arrays.pop("meta")))
    assert meta["waiting_sensor_ids"], "the real snapshot holds no waiting period to attack"
    saver = StateStore(tmp_path / "fuzz")
    path = saver.path_for("pm10")
    rng = random.Random(21)
    outcomes: Counter[str] = Counter()
    uncaught: list[str] = []
    for index in range((LONG if long_form else SHORT) // 3):
        odd_meta, odd_arrays = dict(meta), dict(arrays)
        for _ in range(rng.randint(1, 2)):
            name = rng.choice([*WAITING_ARRAYS, "waiting_sensor_ids", "pending_period"])
            if name == "waiting_sensor_ids":
                odd_meta[name] = _odd_ids(rng, meta[name], meta["sensor_ids"])
            else:
                odd_arrays[name] = _odd_value(rng, arrays[name])
        shutil.rmtree(tmp_path / "fuzz", ignore_errors=True)
        path.parent.mkdir(parents=True)
        np.savez(path, meta=np.array(json.dumps(odd_meta)), **odd_arrays)
        try:
            with capture_logs():
                restored = saver.restore("pm10", geometry)
                if restored is None:
                    assert not path.exists(), "unrestorable snapshot not set aside"
                    outcomes["set_aside"] += 1
                    continue
                windows_work(restored, geometry, tmp_path / f"again-{index}")
            outcomes["restored"] += 1
        except Exception as exc:  # noqa: BLE001  # the finding: collect, then fail below
            uncaught.append(f"#{index}: {type(exc).__name__}: {exc}")
    report("fuzz_window_snapshot_waiting", {**outcomes, "uncaught": len(uncaught)})
    assert not uncaught, uncaught[:5]
    assert outcomes["set_aside"] and outcomes["restored"]  # both ends were reached


def test_corrupt_window_snapshots_are_always_set_aside(tmp_path: Path, long_form: bool) -> None:
    geometry = real_geometry()
    data = real_snapshot(tmp_path / "origin", geometry)
    with capture_logs():
        figures = run_mutations(
            LONG if long_form else SHORT, 12, data, snapshot_trial(tmp_path / "fuzz", geometry)
        )
    report("fuzz_window_snapshot", {**figures, "file_bytes": len(data)})
    assert figures["uncaught"] == 0, figures["first_uncaught"]


# -- the outbox ------------------------------------------------------------------------------


def real_outbox(path: Path) -> bytes:
    """An outbox as the publisher leaves it: queued messages, acknowledged ones removed, drops."""
    with Outbox.open(path, max_messages=100) as outbox:
        for batch in range(8):
            outbox.append(
                [
                    OutboxMessage(
                        topic=f"tesla/gw/node-{n}/pm10",
                        payload=(
                            f'{{"ts": "2027-01-15T08:{batch:02d}:00Z", "raw": {20 + n}.5, '
                            f'"calibrated": {18 + n}.25, "unit": "µg/m³", "quality": []}}'
                        ).encode(),
                        qos=1,
                        retain=True,
                    )
                    for n in range(25)
                ]
            )
            outbox.remove([m.id for m in outbox.peek(10)])
        assert outbox.dropped_total > 0
    assert not path.with_name(path.name + "-wal").exists()  # checkpointed into the file
    return path.read_bytes()


def drain(outbox: Outbox) -> int:
    """Read the queue as the publisher's delivery loop does, acknowledging everything."""
    delivered, sent_up_to = 0, 0
    for _ in range(1000):
        batch = outbox.peek_after(sent_up_to, 64)
        if not batch:
            break
        for message in batch:
            assert isinstance(message.topic, str)
            assert isinstance(message.payload, bytes)
            assert message.qos in (0, 1, 2)
        sent_up_to = batch[-1].id
        outbox.remove([m.id for m in batch])
        delivered += len(batch)
    return delivered


def outbox_trial(directory: Path) -> Callable[[bytes], str]:
    path = directory / "outbox.sqlite3"
    set_aside = SetAsideLog()

    def trial(mutated: bytes) -> str:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        path.write_bytes(mutated)
        before = set_aside.count
        # as the publisher: open at construction, then stats, delivery, a tick's submit
        with Outbox.open(path, max_messages=150, set_aside=set_aside, memory_fallback=True) as box:
            assert not box.in_memory  # the disk is fine: a damaged file is not a disk error
            len(box)
            _ = box.dropped_total
            drain(box)
            box.append([OutboxMessage(topic="tesla/gw/after/pm10", payload=b"{}")])
            after = box.peek(10)
            assert [m.topic for m in after] == ["tesla/gw/after/pm10"]
            assert len(box) == 1
            invalid = box.invalid_rows_dropped
            reset_after_open = box.resets
        with sqlite3.connect(path) as check:  # what is left on disk is a sound database
            assert check.execute("PRAGMA quick_check").fetchone() == ("ok",)
        if set_aside.count > before:
            assert list(directory.glob("outbox.sqlite3.corrupt-*"))
            return "set_aside_while_reading" if reset_after_open else "set_aside_at_open"
        return "invalid_rows_dropped" if invalid else "read"

    return trial


@pytest.fixture
def fast_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory in memory (/dev/shm) when there is one: SQLite's fsyncs cost nothing there."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        yield tmp_path
        return
    directory = Path(tempfile.mkdtemp(prefix="fuzz-outbox-", dir=shm))
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_corrupt_outbox_never_escapes_and_keeps_working(fast_dir: Path, long_form: bool) -> None:
    data = real_outbox(fast_dir / "origin.sqlite3")
    with capture_logs():
        figures = run_mutations(
            LONG if long_form else SHORT, 4, data, outbox_trial(fast_dir / "fuzz")
        )
    report("fuzz_outbox", {**figures, "file_bytes": len(data)})
    assert figures["uncaught"] == 0, figures["first_uncaught"]


# -- the pairs dataset -----------------------------------------------------------------------


def pair_row(minute: int) -> PairRow:
    return PairRow(
        period_start=T0 + minute * 60,
        sensor_id="node-1",
        raw=20.0 + minute,
        reference=18.5,
        calibrated=19.25,
        model_version=3,
        rh=55.0,
        temp_c=None,
    )


def test_damaged_pairs_files_never_stop_the_writer(fast_dir: Path, long_form: bool) -> None:
    """A restarted writer appends to the day's newest file: damage there must not escape."""
    origin = fast_dir / "origin"
    writer = PairsWriter(origin, max_file_bytes=1 << 20)
    assert writer.append([pair_row(m) for m in range(60)]) == 60
    writer.close()
    (written,) = origin.iterdir()
    data = written.read_bytes()
    directory = fast_dir / "fuzz"

    def trial(mutated: bytes) -> str:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir()
        (directory / written.name).write_bytes(mutated)
        again = PairsWriter(directory, max_file_bytes=1 << 20)
        assert again.append([pair_row(60)]) == 1  # written somewhere, never raised
        again.close()
        current = again.files_opened and sorted(directory.iterdir())[-1]
        assert current and current.read_bytes().endswith(b"\n")
        return "appended" if current.name == written.name else "next_part"

    figures = run_mutations((LONG if long_form else SHORT) // 3, 7, data, trial)
    report("fuzz_pairs", {**figures, "file_bytes": len(data)})
    assert figures["uncaught"] == 0, figures["first_uncaught"]

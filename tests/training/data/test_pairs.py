"""The recorded-pairs loader: rotation files, torn last lines, errors that say what to fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from training.data import clean, load_dataset, load_pairs, read_pairs
from training.data.pairs import TRUNCATED_LINE, pairs_files
from training.errors import DataError, FeatureMismatchError, NoPairsError

HEADER = "timestamp,sensor_id,raw,reference,calibrated,model_version,rh,temp_c"


def _write(path: Path, lines: list[str], *, newline_at_end: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join(lines) + ("\n" if newline_at_end else "")
    path.write_bytes(text.encode("ascii"))
    return path


def _row(minute: int, sensor: str = "node-1", raw: float = 20.0, ref: float = 10.0) -> str:
    hour, rest = divmod(minute, 60)
    return f"2024-03-01T{hour:02d}:{rest:02d}:00Z,{sensor},{raw},{ref},{ref + 0.5},3,55.0,"


@pytest.fixture
def pairs_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "state" / "pairs" / "pm10"
    # Rotation: the day's first file, then parts 1, 2 and 10 (sorted numerically, not as text).
    _write(directory / "pairs-20240301.csv", [HEADER, _row(0), _row(1, "node-2")])
    _write(directory / "pairs-20240301-1.csv", [HEADER, _row(2), _row(3, raw=22.0)])
    _write(directory / "pairs-20240301-2.csv", [HEADER, _row(4, ref=11.0)])
    # A writer that crashed mid-row leaves bytes after the last newline.
    _write(
        directory / "pairs-20240301-10.csv",
        [HEADER, _row(5), "2024-03-01T00:06:00Z,node-1,2"],
        newline_at_end=False,
    )
    (directory / "notes.txt").write_text("not a pairs file")
    return directory


def test_reads_every_rotation_file_and_skips_the_torn_line(pairs_dir: Path) -> None:
    pairs = read_pairs(pairs_dir)
    assert [path.name for path in pairs.files] == [
        "pairs-20240301.csv",
        "pairs-20240301-1.csv",
        "pairs-20240301-2.csv",
        "pairs-20240301-10.csv",
    ]
    data = pairs.data
    assert data.feature == "pm10"  # from the directory name
    assert data.period_seconds == 60
    assert data.target == "reference"
    assert data.covariates == ("rh",)  # temp_c is empty everywhere: absent, not NaN
    assert list(data.frame.columns) == ["timestamp", "sensor_id", "raw", "reference", "rh"]
    node1 = data.frame[data.frame["sensor_id"] == "node-1"]
    assert [t.minute for t in node1["timestamp"]] == [0, 2, 3, 4, 5]
    assert node1["raw"].tolist() == [20.0, 20.0, 22.0, 20.0, 20.0]
    assert node1["reference"].tolist() == [10.0, 10.0, 10.0, 11.0, 10.0]
    assert pairs.truncated_lines["pairs-20240301-10.csv"] == 1
    assert sum(pairs.truncated_lines.values()) == 1
    # The torn line is counted where cleaning reports removals.
    _, report = clean(data)
    assert report.rows_dropped[TRUNCATED_LINE] == 1
    assert report.rows_read == 7
    summary = pairs.summary()
    assert summary["rows"] == 6
    assert summary["truncated_lines_skipped"] == 1
    assert summary["model_versions"] == {"3": 6}
    assert summary["first"] == "2024-03-01T00:00:00Z"
    assert summary["last"] == "2024-03-01T00:05:00Z"
    recorded = pairs.recorded
    assert list(recorded.columns) == [
        "timestamp", "sensor_id", "reference", "calibrated", "model_version"
    ]  # fmt: skip
    assert np.allclose(recorded["calibrated"] - recorded["reference"], 0.5)


def test_the_registry_and_the_parent_directory(pairs_dir: Path) -> None:
    via_registry = load_dataset("pairs", pairs_dir, period_seconds=60)
    assert len(via_registry.frame) == 6
    parent = load_pairs(pairs_dir.parent, feature="pm10")
    assert len(parent.frame) == 6


def test_a_torn_header_and_empty_files_are_skipped(tmp_path: Path) -> None:
    directory = tmp_path / "pm2_5"
    _write(directory / "pairs-20240301.csv", [HEADER, _row(0), _row(1)])
    _write(directory / "pairs-20240302.csv", ["timestamp,sens"], newline_at_end=False)
    (directory / "pairs-20240303.csv").write_bytes(b"")
    _write(directory / "pairs-20240304.csv", [HEADER])
    pairs = read_pairs(directory, period_seconds=60)
    assert pairs.data.feature == "pm2_5"
    assert pairs.rows == 2
    assert pairs.truncated_lines["pairs-20240302.csv"] == 1


def test_empty_values_in_optional_columns(tmp_path: Path) -> None:
    directory = tmp_path / "pm1"
    _write(
        directory / "pairs-20240301.csv",
        [HEADER, "2024-03-01T00:00:00Z,a,5.0,4.0,,,,", "2024-03-01T00:01:00Z,a,6.0,4.5,,,,3.5"],
    )
    pairs = read_pairs(directory)
    assert pairs.data.covariates == ("temp_c",)
    assert pairs.recorded["calibrated"].isna().all()
    assert pairs.summary()["model_versions"] == {}


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(NoPairsError, match="does not exist"):
        read_pairs(tmp_path / "nowhere" / "pm10")


def test_directory_without_pairs_files(tmp_path: Path) -> None:
    (tmp_path / "pm10").mkdir()
    with pytest.raises(NoPairsError, match=r"no pairs-YYYYMMDD\.csv files"):
        read_pairs(tmp_path / "pm10")


def test_files_without_a_complete_row(tmp_path: Path) -> None:
    _write(
        tmp_path / "pm10" / "pairs-20240301.csv", [HEADER, "2024-03-01T00:0"], newline_at_end=False
    )
    with pytest.raises(NoPairsError, match="no complete row"):
        read_pairs(tmp_path / "pm10")


def test_feature_mismatch(pairs_dir: Path) -> None:
    with pytest.raises(FeatureMismatchError, match="holds pm10 pairs, not pm2_5"):
        read_pairs(pairs_dir, feature="pm2_5")


def test_feature_needed_when_the_name_does_not_say(tmp_path: Path) -> None:
    _write(tmp_path / "mine" / "pairs-20240301.csv", [HEADER, _row(0), _row(1)])
    with pytest.raises(DataError, match="cannot tell the feature"):
        read_pairs(tmp_path / "mine")
    assert read_pairs(tmp_path / "mine", feature="pm10").rows == 2


def test_not_a_pairs_file(tmp_path: Path) -> None:
    _write(tmp_path / "pm10" / "pairs-20240301.csv", ["timestamp,sensor_id,raw,reference", _row(0)])
    with pytest.raises(DataError, match=r"pairs-20240301.csv: line 1 \(header\): not a pairs file"):
        read_pairs(tmp_path / "pm10")


def test_a_bad_cell_is_reported_with_file_and_line(pairs_dir: Path) -> None:
    _write(
        pairs_dir / "pairs-20240302.csv",
        [HEADER, _row(0), "2024-03-02T00:01:00Z,node-1,oops,1,,,,"],
    )
    with pytest.raises(DataError, match=r"pairs-20240302.csv: line 3, column 'raw'"):
        read_pairs(pairs_dir)


def test_file_order_is_by_day_then_part(tmp_path: Path) -> None:
    for name in ("pairs-20240302.csv", "pairs-20240301-2.csv", "pairs-20240301.csv"):
        _write(tmp_path / name, [HEADER])
    assert [p.name for p in pairs_files(tmp_path)] == [
        "pairs-20240301.csv",
        "pairs-20240301-2.csv",
        "pairs-20240302.csv",
    ]


NEW_HEADER = HEADER + ",quality"


def test_old_and_new_headers_in_one_directory(tmp_path: Path) -> None:
    """A gateway upgraded mid-day wrote the day's first part without ``quality``, the next with."""
    directory = tmp_path / "pm10"
    _write(directory / "pairs-20240301.csv", [HEADER, _row(0), _row(1)])
    _write(
        directory / "pairs-20240301-1.csv",
        [NEW_HEADER, _row(2) + ",ok", _row(3) + ",warming_up;gap", _row(4) + ","],
    )
    pairs = read_pairs(directory)
    assert pairs.rows == 5 and pairs.data.period_seconds == 60
    assert list(pairs.data.frame.columns) == ["timestamp", "sensor_id", "raw", "reference", "rh"]
    assert pairs.data.load_counts is not None and pairs.data.load_counts.rows_dropped == {}


def test_rows_published_stuck_are_dropped_with_their_run(tmp_path: Path) -> None:
    """The flagged rows and the rest of their run, the same sensor's adjacent rows of the same raw
    value (also across files): counted as ``raw:stuck``, the key of cleaning's own run rule."""
    directory = tmp_path / "pm10"
    _write(
        directory / "pairs-20240301.csv",
        [
            NEW_HEADER,
            _row(0, raw=7.0) + ",ok",
            _row(1, raw=3.0) + ",ok",  # another value: the run starts after it
            _row(2, raw=0.0) + ",ok",  # published before the gateway could know
            _row(3, raw=0.0) + ",warming_up",
            _row(3, "node-2", raw=0.0) + ",ok",  # another sensor, the same value: kept
        ],
    )
    _write(
        directory / "pairs-20240301-1.csv",
        [
            NEW_HEADER,
            _row(4, raw=0.0) + ",stuck",
            _row(5, raw=0.0) + ",stuck",
            _row(6, raw=0.0) + ",warming_up",  # a gateway restarted mid-run: still the run
            _row(7) + ",ok;out_of_domain",
            _row(8, raw=0.0) + ",ok",  # a new run: another value came between
        ],
    )
    pairs = read_pairs(directory, period_seconds=60)
    node1 = pairs.data.frame[pairs.data.frame["sensor_id"] == "node-1"]
    assert [t.minute for t in node1["timestamp"]] == [0, 1, 7, 8]
    assert pairs.data.sensor_ids == ("node-1", "node-2")
    _, report = clean(pairs.data)
    assert report.rows_dropped == {"raw:stuck": 5}
    assert report.rows_read == 10 and report.rows_kept == 5
    assert len(pairs.recorded) == 10  # what the gateway published stays on record


def test_a_quality_header_with_an_unknown_column_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "pm10" / "pairs-20240301.csv", [NEW_HEADER + ",extra", _row(0) + ",ok,1"])
    with pytest.raises(DataError, match=r"not a pairs file \(unknown \['extra'\]"):
        read_pairs(tmp_path / "pm10")

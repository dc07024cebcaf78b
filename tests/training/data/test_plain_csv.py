"""The plain CSV loader: formats users write, and errors that point at the offending cell."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.training.data.layouts import write_lines
from training.data import load_dataset, load_plain_csv
from training.errors import DataError


def test_iso_variants_are_utc(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "mine.csv",
        [
            "sensor_id,timestamp,raw,reference,rh",
            "node-1,2024-03-01T10:00:00Z,12.5,10.0,55",
            "node-1,2024-03-01T12:01:00+02:00,13.5,,56",  # = 10:01 UTC
            "node-1,2024-03-01 10:02:00,14.5,11.0,",  # naive = UTC
        ],
    )
    data = load_plain_csv(path, feature="pm10")
    assert data.feature == "pm10"
    assert data.period_seconds == 60
    assert data.covariates == ("rh",)
    assert [str(t) for t in data.frame["timestamp"]] == [
        "2024-03-01 10:00:00+00:00",
        "2024-03-01 10:01:00+00:00",
        "2024-03-01 10:02:00+00:00",
    ]
    assert data.frame["raw"].tolist() == [12.5, 13.5, 14.5]
    assert np.isnan(data.frame["reference"].iloc[1])
    assert np.isnan(data.frame["rh"].iloc[2])


def test_epoch_seconds_and_inferred_period(tmp_path: Path) -> None:
    lines = ["timestamp,sensor_id,raw,reference,temp_c"]
    lines += [f"{1_700_000_000 + 300 * k},a,{k},{k},{k}" for k in range(5)]
    lines += [f"{1_700_000_000 + 300 * k + 1},b,{k},{k},{k}" for k in (0, 1, 2, 5)]
    data = load_plain_csv(write_lines(tmp_path / "epoch.csv", lines))
    assert data.period_seconds == 300
    assert data.frame["timestamp"].iloc[0].timestamp() == 1_700_000_000
    assert load_plain_csv(tmp_path / "epoch.csv", period_seconds=60).period_seconds == 60


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            ["timestamp,sensor_id,raw", "1,a,2"],
            r"line 1 \(header\): missing column\(s\) \['reference'\]",
        ),
        (
            ["timestamp,sensor_id,raw,reference,pm"],
            r"line 1 \(header\): unknown column\(s\) \['pm'\]",
        ),
        (["timestamp,sensor_id,raw,raw,reference"], r"line 1 \(header\): repeated column"),
        (
            ["timestamp,sensor_id,raw,reference", "2024-01-01T00:00:00Z,a,1,1", "31/12/2024,a,1,1"],
            r"line 3, column 'timestamp': cannot parse timestamp.*'31/12/2024'",
        ),
        (
            ["timestamp,sensor_id,raw,reference", "2024-01-01T00:00:00Z,a,1,1", ",a,1,1"],
            r"line 3, column 'timestamp': empty timestamp",
        ),
        (
            ["timestamp,sensor_id,raw,reference", "100,a,1,1", "160,a,1.2.3,1"],
            r"line 3, column 'raw': not a number: '1.2.3'",
        ),
        (
            ["timestamp,sensor_id,raw,reference", "100,a b,1,1"],
            r"line 2, column 'sensor_id': 'a b' is not a valid sensor id",
        ),
        (["timestamp,sensor_id,raw,reference", "100,a,1,1"], r"cannot infer the period"),
        (["timestamp,sensor_id,raw,reference"], r"no data rows"),
    ],
)
def test_errors_name_file_line_and_column(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write_lines(tmp_path / "user.csv", lines)
    with pytest.raises(DataError, match=message) as caught:
        load_plain_csv(path)
    assert str(path) in str(caught.value)


COMMA_LINES = [
    "timestamp,sensor_id,raw,reference,rh",
    "2024-03-01T10:00:00Z,007,12.5,10.25,55",
    "2024-03-01T10:01:00Z,007,1013.75,,56.5",
    "2024-03-01T10:02:00Z,007,14,11,",
]


@pytest.mark.parametrize(
    ("name", "lines", "encoding"),
    [
        # Excel's "CSV" in a German, French, Italian or Dutch locale: ';' and a decimal comma.
        ("semicolon", [line.replace(",", ";").replace(".", ",") for line in COMMA_LINES], "utf-8"),
        ("tab", [line.replace(",", "\t") for line in COMMA_LINES], "utf-8"),
        ("excel-utf8-bom", COMMA_LINES, "utf-8-sig"),
        (
            "spaced-capitalised-header",
            [" Timestamp , Sensor_ID,RAW,Reference ,RH", *COMMA_LINES[1:]],
            "utf-8",
        ),
    ],
)
def test_spreadsheet_dialects_load_the_same_values(
    tmp_path: Path, name: str, lines: list[str], encoding: str
) -> None:
    expected = load_plain_csv(write_lines(tmp_path / "comma.csv", COMMA_LINES))
    path = tmp_path / f"{name}.csv"
    path.write_text("\r\n".join(lines) + "\r\n", encoding=encoding)
    data = load_plain_csv(path)
    assert data.covariates == ("rh",)
    assert data.frame["sensor_id"].tolist() == ["007"] * 3  # an id is text, never a number
    for column in ("timestamp", "raw", "reference", "rh"):
        assert data.frame[column].equals(expected.frame[column]), column
    assert data.frame["raw"].tolist() == [12.5, 1013.75, 14.0]


def test_a_semicolon_file_names_the_cell_it_cannot_read(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "semi.csv",
        ["timestamp;sensor_id;raw;reference", "100;a;1,5;1", "160;a;1.234,5;1"],
    )
    with pytest.raises(DataError, match=r"line 3, column 'raw': not a number: '1.234,5'"):
        load_plain_csv(path)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="file not found"):
        load_dataset("csv", tmp_path / "absent.csv")


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["s1", "s-2", "node_3"]),
            st.integers(min_value=0, max_value=10_000),
            st.floats(min_value=0, max_value=1000, allow_nan=False, width=32),
            st.one_of(st.none(), st.floats(min_value=0, max_value=1000, width=32)),
        ),
        min_size=2,
        max_size=30,
        unique_by=lambda row: (row[0], row[1]),
    ),
    epoch=st.booleans(),
)
def test_round_trip(rows: list[tuple[str, int, float, float | None]], epoch: bool) -> None:
    """Whatever we write in either timestamp form, the loader reads back the same rows."""
    start = 1_600_000_000
    lines = ["timestamp,sensor_id,raw,reference"]
    for sensor, minute, raw, reference in rows:
        seconds = start + 60 * minute
        stamp = str(seconds) if epoch else np.datetime_as_string(np.datetime64(seconds, "s")) + "Z"
        lines.append(f"{stamp},{sensor},{raw!r},{'' if reference is None else repr(reference)}")
    with tempfile.TemporaryDirectory() as directory:
        data = load_plain_csv(write_lines(Path(directory) / "r.csv", lines), period_seconds=60)
    expected = sorted(
        (sensor, start + 60 * minute, raw, reference) for sensor, minute, raw, reference in rows
    )
    frame = data.frame
    got = [
        (s, int(t.timestamp()), r, None if np.isnan(ref) else ref)
        for s, t, r, ref in zip(
            frame["sensor_id"], frame["timestamp"], frame["raw"], frame["reference"], strict=True
        )
    ]
    assert got == expected

"""The pairs dataset: exact CSV format, daily and size rotation, crash repair, write failures,
older files left as they are."""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from tesla_gateway.contract.calibrated import Quality
from tesla_gateway.monitor.pairs import (
    HEADER,
    PairRow,
    PairsWriter,
    format_row,
    pairs_file_name,
    pairs_file_part,
)

DAY = datetime(2020, 1, 10, 12, 34, tzinfo=UTC).timestamp()


def row(offset_s: float = 0.0, sensor: str = "s1", **fields: object) -> PairRow:
    values: dict[str, object] = {
        "raw": 30.5,
        "reference": 21.25,
        "calibrated": 20.1234567,
        "model_version": 3,
        "rh": 55.0,
        "temp_c": 21.5,
        "quality": (Quality.OK,),
    }
    values.update(fields)
    return PairRow(period_start=DAY + offset_s, sensor_id=sensor, **values)  # type: ignore[arg-type]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="ascii").splitlines()


def test_row_format_is_exact() -> None:
    assert format_row(row()) == "2020-01-10T12:34:00Z,s1,30.5,21.25,20.1235,3,55.0,21.5,ok\n"
    empty = row(calibrated=None, model_version=None, rh=None, temp_c=None, quality=())
    assert format_row(empty) == "2020-01-10T12:34:00Z,s1,30.5,21.25,,,,,\n"
    flagged = row(calibrated=None, quality=(Quality.WARMING_UP, Quality.GAP))
    assert format_row(flagged).endswith(",,3,55.0,21.5,warming_up;gap\n")
    with pytest.raises(ValueError, match="sensor id"):
        format_row(row(sensor="a,b"))


def test_rows_go_to_daily_files_with_a_header(tmp_path: Path) -> None:
    writer = PairsWriter(tmp_path / "pm10", max_file_bytes=1 << 20)
    assert writer.append([row(), row(60), row(86_400)]) == 3
    first = tmp_path / "pm10" / "pairs-20200110.csv"
    # Still open, but every row is already flushed to the file.
    assert lines(first) == [
        HEADER,
        "2020-01-10T12:34:00Z,s1,30.5,21.25,20.1235,3,55.0,21.5,ok",
        "2020-01-10T12:35:00Z,s1,30.5,21.25,20.1235,3,55.0,21.5,ok",
    ]
    writer.close()
    second = tmp_path / "pm10" / "pairs-20200111.csv"
    assert lines(second)[0] == HEADER and len(lines(second)) == 2
    with second.open(newline="") as handle:
        parsed = list(csv.DictReader(handle))
    assert parsed[0]["timestamp"] == "2020-01-11T12:34:00Z" and parsed[0]["rh"] == "55.0"
    assert parsed[0]["quality"] == "ok"


def test_size_rotation_numbers_the_parts(tmp_path: Path) -> None:
    line = len(format_row(row()))
    writer = PairsWriter(tmp_path, max_file_bytes=1024)  # the configuration's floor
    per_file = (1024 - len(HEADER) - 1) // line
    writer.append([row(i) for i in range(2 * per_file + 1)])
    writer.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["pairs-20200110-1.csv", "pairs-20200110-2.csv", "pairs-20200110.csv"]
    for name in names:
        content = lines(tmp_path / name)
        assert content[0] == HEADER
        assert (tmp_path / name).stat().st_size <= writer.max_file_bytes
    assert sum(len(lines(tmp_path / n)) - 1 for n in names) == 2 * per_file + 1


def test_restart_appends_and_cuts_a_torn_last_line(tmp_path: Path) -> None:
    writer = PairsWriter(tmp_path, max_file_bytes=1 << 20)
    writer.append([row(), row(60)])
    writer.close()
    path = tmp_path / "pairs-20200110.csv"
    with path.open("ab") as handle:
        handle.write(b"2020-01-10T12:36:00Z,s1,30")  # a crash in the middle of a row
    again = PairsWriter(tmp_path, max_file_bytes=1 << 20)
    again.append([row(180)])
    again.close()
    content = lines(path)
    assert content[0] == HEADER and len(content) == 4
    assert content[-1].startswith("2020-01-10T12:37:00Z,s1,")
    assert content.count(HEADER) == 1


def test_a_foreign_file_is_left_alone(tmp_path: Path) -> None:
    (tmp_path / "pairs-20200110.csv").write_text("something,else\n1,2\n")
    writer = PairsWriter(tmp_path, max_file_bytes=1 << 20)
    writer.append([row()])
    writer.close()
    assert lines(tmp_path / "pairs-20200110.csv") == ["something,else", "1,2"]
    assert lines(tmp_path / "pairs-20200110-1.csv")[0] == HEADER


@pytest.mark.parametrize("rows_in_old_file", [0, 2])
def test_a_file_of_the_older_header_gets_no_row_of_the_new_shape(
    tmp_path: Path, rows_in_old_file: int
) -> None:
    """A gateway upgraded mid-day: the day's file lacks ``quality``; the rows go to a new part."""
    old_header = HEADER.removesuffix(",quality")
    old_rows = [f"2020-01-10T12:3{i}:00Z,s1,30.5,21.25,20.1235,3,55.0,21.5" for i in range(2)]
    old = tmp_path / "pairs-20200110.csv"
    old.write_text("\n".join([old_header, *old_rows[:rows_in_old_file]]) + "\n")
    before = old.read_bytes()
    writer = PairsWriter(tmp_path, max_file_bytes=1 << 20)
    assert writer.append([row(120), row(180)]) == 2
    assert writer.current_file == tmp_path / "pairs-20200110-1.csv"
    writer.close()
    assert old.read_bytes() == before
    assert lines(tmp_path / "pairs-20200110-1.csv") == [
        HEADER,
        "2020-01-10T12:36:00Z,s1,30.5,21.25,20.1235,3,55.0,21.5,ok",
        "2020-01-10T12:37:00Z,s1,30.5,21.25,20.1235,3,55.0,21.5,ok",
    ]
    # A restart appends to the new part, never to the old file.
    again = PairsWriter(tmp_path, max_file_bytes=1 << 20)
    again.append([row(240)])
    again.close()
    assert old.read_bytes() == before
    assert len(lines(tmp_path / "pairs-20200110-1.csv")) == 4


def test_write_failure_is_counted_logged_once_and_recovers(tmp_path: Path) -> None:
    target = tmp_path / "pm10"
    target.write_text("a file where the directory should be")  # every open fails
    writer = PairsWriter(target, max_file_bytes=1 << 20)
    with capture_logs() as logs:
        assert writer.append([row(), row(60)]) == 0
        assert writer.append([row(120)]) == 0
        target.unlink()
        assert writer.append([row(180)]) == 1
    writer.close()
    assert writer.rows_failed == 3 and writer.rows_written == 1
    assert writer.stats()["last_error"]
    events = [entry["event"] for entry in logs]
    assert events == ["pairs_write_failed", "pairs_write_recovered"]
    assert len(lines(target / "pairs-20200110.csv")) == 2


@pytest.mark.parametrize("part", [0, 1, 12])
def test_the_file_name_rule_reads_back_what_it_writes(part: int) -> None:
    """One rule names and recognises pairs files (training's loader imports it)."""
    assert pairs_file_part(pairs_file_name("20261123", part)) == ("20261123", part)
    assert pairs_file_part("pairs-20261123.csv.tmp") is None
    assert pairs_file_part("notes.csv") is None

"""Every loader on small files written in the real layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tesla_gateway.contract.sensor_kind import PMS5003_ATM
from tests.training.data.layouts import (
    ANTWERP_HEADER,
    ISPRA_HEADER,
    SENSEURCITY_COLUMNS,
    senseurcity_row,
    write_lines,
)
from training.data import (
    CoLocationData,
    load_antwerp,
    load_dataset,
    load_ispra,
    load_senseurcity,
)
from training.errors import DataError, TrainingError


def _check_tidy(data: CoLocationData) -> None:
    frame = data.frame
    assert str(frame["timestamp"].dtype) == "datetime64[ns, UTC]"
    assert pd.api.types.is_string_dtype(frame["sensor_id"])
    for column in ("raw", "reference", *data.covariates):
        assert frame[column].dtype == np.float64


@pytest.fixture
def ispra_dir(tmp_path: Path) -> Path:
    write_lines(
        tmp_path / "Ispra_4065E0.csv",
        [
            ISPRA_HEADER,
            "2020-01-17T15:56:00Z,4065E0,30.0,8.625,16.6914,7.6,62.0,997.1,",
            "2020-01-17T15:57:00Z,4065E0,29.6667,1236.5,16.6914,7.6,62.0,997.1,",
            "2020-01-17T15:58:00Z,4065E0,,,-0.9,7.5,63.0,997.1,",
        ],
    )
    write_lines(
        tmp_path / "Ispra_406414.csv",
        [ISPRA_HEADER, "2020-01-17T15:56:00Z,406414,41.0,,18.2,7.6,62.0,997.1,12.0"],
    )
    (tmp_path / "notes.txt").write_text("not a data file", encoding="utf-8")
    return tmp_path


def test_ispra_station_target(ispra_dir: Path) -> None:
    data = load_ispra(ispra_dir)
    _check_tidy(data)
    assert data.feature == "pm10"
    assert data.period_seconds == 60
    assert data.target == "ref_pm10"
    # The hex-looking id must stay text (a CSV reader would turn 4065E0 into 4065.0).
    assert data.sensor_ids == ("406414", "4065E0")
    assert data.load_counts is not None
    assert data.load_counts.rows_read == 4
    box = data.frame[data.frame["sensor_id"] == "4065E0"]
    assert box["raw"].tolist()[:2] == [30.0, 29.6667]
    assert np.isnan(box["raw"].iloc[2])
    assert box["reference"].tolist()[:2] == [16.6914, 16.6914]
    assert box["rh"].tolist() == [62.0, 62.0, 63.0]
    assert box["temp_c"].tolist() == [7.6, 7.6, 7.5]
    assert "SensEURCity" in data.attribution
    assert data.sensor == PMS5003_ATM  # pms5003_pm10_atm: the manifest's sensor


def test_ispra_opcn3_target(ispra_dir: Path) -> None:
    data = load_ispra(ispra_dir, target="opcn3")
    assert data.target == "opcn3_pm10"
    box = data.frame[data.frame["sensor_id"] == "4065E0"]
    assert box["reference"].iloc[:2].tolist() == [8.625, 1236.5]
    with pytest.raises(DataError, match="target must be 'station' or 'opcn3'"):
        load_ispra(ispra_dir, target="ref")  # type: ignore[arg-type]


def test_ispra_missing_column_names_file(tmp_path: Path) -> None:
    write_lines(
        tmp_path / "Ispra_X.csv", ["time_utc,sensor_id,ref_pm10", "2020-01-01T00:00:00Z,X,1"]
    )
    with pytest.raises(DataError, match=r"Ispra_X\.csv: line 1 \(header\).*pms5003_pm10_atm"):
        load_ispra(tmp_path)


def test_ispra_bad_timestamp_names_line(tmp_path: Path) -> None:
    write_lines(
        tmp_path / "Ispra_Y.csv",
        [
            ISPRA_HEADER,
            "2020-01-17T15:56:00Z,Y,30.0,,16.0,7.6,62.0,997.1,",
            "yesterday,Y,30.0,,16.0,7.6,62.0,997.1,",
        ],
    )
    with pytest.raises(DataError, match=r"Ispra_Y\.csv: line 3, column 'time_utc'.*yesterday"):
        load_ispra(tmp_path)


def test_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no files matching"):
        load_ispra(tmp_path)
    with pytest.raises(TrainingError, match="does not exist"):
        load_antwerp(tmp_path / "absent")


def test_antwerp_features(tmp_path: Path) -> None:
    write_lines(
        tmp_path / "Antwerp_4043A7.csv",
        [
            ANTWERP_HEADER,
            "2020-06-18T01:00:00Z,Antwerp_4043A7,ANT_REF_R802,51.2097,4.4318,11.0028,11.4667,,",
            "2020-06-18T02:00:00Z,Antwerp_4043A7,ANT_REF_R802,51.2096,4.4318,3319.6,3319.5,8.5,12.1",
        ],
    )
    pm25 = load_antwerp(tmp_path)
    _check_tidy(pm25)
    assert (pm25.feature, pm25.period_seconds, pm25.target) == ("pm2_5", 3600, "ref_pm25")
    assert pm25.covariates == ()
    assert pm25.frame["raw"].tolist() == [11.0028, 3319.6]
    assert np.isnan(pm25.frame["reference"].iloc[0])
    assert pm25.frame["reference"].iloc[1] == 8.5
    pm10 = load_antwerp(tmp_path, feature="pm10")
    assert (pm10.feature, pm10.target) == ("pm10", "ref_pm10")
    assert pm10.frame["raw"].tolist() == [11.4667, 3319.5]
    assert pm10.frame["reference"].iloc[1] == 12.1
    assert pm25.sensor == pm10.sensor == PMS5003_ATM  # pms5003_*_atm


def _senseurcity_files(directory: Path) -> list[Path]:
    antwerp = [
        senseurcity_row(
            {
                "date": f"2020-04-02T12:{minute:02d}:00Z",
                "Location.ID": "ANT_REF_R801",
                "5310CAT": 30 + minute,
                "5325CAT": 20 + minute,
                "5301CAT": 10 + minute,
                "OPCN3PM10": 5 + minute,
                "OPCN3PM25": 4 + minute,
                "SHT31HE": 60 + minute,
                "SHT31TE": 10 + minute / 10,
                "5310CAT_flag": "W" if minute < 2 else None,
                "5325CAT_flag": "W" if minute < 2 else None,
                "OPCN3PM10_flag": "W" if minute < 3 else None,
                "OPCN3PM25_flag": "W" if minute < 3 else None,
                "SHT31HE_flag": "W" if minute < 3 else None,
                "Ref.PM10": 20.5 if minute != 4 else None,
                "Ref.PM2.5": 12.25,
                "Ref.PM1": 8.0,
                "CO_A4_P1": "garbled;text",  # an unread column may hold anything
            }
        )
        for minute in range(6)
    ]
    zagreb = [
        senseurcity_row(
            {
                "date": f"2020-05-21T12:{minute:02d}:00",
                "Location.ID": "ZAG_REF_IMI",
                "5310CAT": 7,
                "5325CAT": 5.5,
                "OPCN3PM10": 209.09375,
                "Ref.PM10": 14.3,
            }
        )
        for minute in range(3)
    ]
    # The Zagreb layout has no Ref.PM1 column at all.
    zagreb_columns = [name for name in SENSEURCITY_COLUMNS if name != "Ref.PM1"]
    zagreb_rows = [row.rsplit(",", 1)[0] for row in zagreb]
    return [
        write_lines(directory / "Antwerp_402B00.csv", [",".join(SENSEURCITY_COLUMNS), *antwerp]),
        write_lines(directory / "Zagreb_64C52B.csv", [",".join(zagreb_columns), *zagreb_rows]),
    ]


def test_senseurcity_station_target_drops_warm_up(tmp_path: Path) -> None:
    _senseurcity_files(tmp_path)
    data = load_senseurcity(tmp_path, feature="pm10", target="station")
    _check_tidy(data)
    assert data.sensor_ids == ("Antwerp_402B00", "Zagreb_64C52B")
    assert (data.feature, data.target, data.period_seconds) == ("pm10", "Ref.PM10", 60)
    antwerp = data.frame[data.frame["sensor_id"] == "Antwerp_402B00"]
    # minutes 0 and 1 are raw warm-up: dropped and counted
    assert antwerp["raw"].tolist() == [32.0, 33.0, 34.0, 35.0]
    assert antwerp["reference"].tolist()[:2] == [20.5, 20.5]
    assert np.isnan(antwerp["reference"].iloc[2])
    # minute 2's humidity is flagged W: NaN; temperature is not flagged
    assert np.isnan(antwerp["rh"].iloc[0])
    assert antwerp["rh"].tolist()[1:] == [63.0, 64.0, 65.0]
    assert antwerp["temp_c"].tolist() == [10.2, 10.3, 10.4, 10.5]
    zagreb = data.frame[data.frame["sensor_id"] == "Zagreb_64C52B"]
    assert zagreb["raw"].tolist() == [7.0, 7.0, 7.0]
    assert str(zagreb["timestamp"].iloc[0]) == "2020-05-21 12:00:00+00:00"  # naive = UTC
    assert data.load_counts is not None
    assert data.load_counts.rows_read == 9
    assert dict(data.load_counts.rows_dropped) == {"raw:warmup": 2}
    assert dict(data.load_counts.values_nulled) == {"rh:warmup": 1}
    assert data.sensor == PMS5003_ATM  # 5310CAT: the PMS5003's ATM channel


def test_senseurcity_opcn3_target_and_missing_reference_column(tmp_path: Path) -> None:
    files = _senseurcity_files(tmp_path)
    data = load_senseurcity(files, feature="pm2_5", target="opcn3")
    antwerp = data.frame[data.frame["sensor_id"] == "Antwerp_402B00"]
    assert antwerp["raw"].tolist() == [22.0, 23.0, 24.0, 25.0]
    assert np.isnan(antwerp["reference"].iloc[0])  # OPC-N3 still warming up at minute 2
    assert antwerp["reference"].tolist()[1:] == [7.0, 8.0, 9.0]
    assert data.load_counts is not None
    assert data.load_counts.values_nulled["reference:warmup"] == 1
    pm1 = load_senseurcity(files, feature="pm1", target="station")
    zagreb = pm1.frame[pm1.frame["sensor_id"] == "Zagreb_64C52B"]
    assert zagreb["reference"].isna().all()  # that file has no Ref.PM1 column
    with pytest.raises(DataError, match=r"Ref\.PM1"):
        load_senseurcity([files[1]], feature="pm1")


def test_registry_names_and_errors(tmp_path: Path, ispra_dir: Path) -> None:
    data = load_dataset("ispra-1min-opcn3", ispra_dir)
    assert data.target == "opcn3_pm10"
    synthetic = load_dataset("synthetic", None, n_sensors=3, days=0.5, seed=3)
    assert synthetic.sensor_ids == ("SYN000", "SYN001", "SYN002")
    with pytest.raises(DataError, match=r"unknown dataset 'ispra'.*ispra-1min"):
        load_dataset("ispra", None)
    with pytest.raises(DataError, match=r"does not take option\(s\) \['target'\]"):
        load_dataset("ispra-1min", ispra_dir, target="opcn3")
    with pytest.raises(DataError, match="needs a path"):
        load_dataset("csv", None)
    with pytest.raises(DataError, match="takes no path"):
        load_dataset("synthetic", tmp_path)


def test_default_data_dir_follows_environment(
    tmp_path: Path, ispra_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from training.data import default_data_dir

    monkeypatch.delenv("TESLA_DATA_DIR", raising=False)
    assert default_data_dir() == Path(__file__).resolve().parents[3].parent / "shared" / "data"
    monkeypatch.setenv("TESLA_DATA_DIR", str(tmp_path))
    assert default_data_dir() == tmp_path
    with pytest.raises(DataError, match=r"not found at .*TESLA_DATA_DIR"):
        load_dataset("antwerp-hourly-pm10", None)

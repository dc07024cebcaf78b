"""Writers for tiny files in each source's real column layout (our own values, not copies)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

ISPRA_HEADER = (
    "time_utc,sensor_id,pms5003_pm10_atm,opcn3_pm10,ref_pm10,ref_temp_c,ref_rh,"
    "ref_press_hpa,shield_temp_int_c"
)
ANTWERP_HEADER = (
    "time_utc,sensor_id,location_id,latitude,longitude,pms5003_pm25_atm,pms5003_pm10_atm,"
    "ref_pm25,ref_pm10"
)
# The SensEURCity per-box layout: identity and position, gas and PM sensors, flags, references.
SENSEURCITY_COLUMNS = (  # noqa: SIM905 - one string reads like the real header line
    "date,latitude,longitude,altitude,Location.ID,BMP280,SHT31HE,SHT31TE,Absolute_humidity,"
    "SHT31HI,SHT31TI,CO_A4_P1,5301CAT,5301CST,5325CAT,5325CST,5310CAT,5310CST,"
    "OPCN3PM1,OPCN3PM25,OPCN3PM10,OPCN3Hum,OPCN3Temp,CO_A4_P1_flag,5301CAT_flag,"
    "5301CST_flag,OPCN3PM1_flag,5310CAT_flag,5310CST_flag,OPCN3PM10_flag,5325CAT_flag,"
    "5325CST_flag,OPCN3PM25_flag,BMP280_flag,SHT31HE_flag,SHT31HI_flag,SHT31TE_flag,"
    "SHT31TI_flag,Ref.Long,Ref.Lat,Ref.Press,Ref.RH,Ref.Temp,Ref.NO2,Ref.PM10,Ref.PM2.5,Ref.PM1"
).split(",")


def write_lines(path: Path, lines: Sequence[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def senseurcity_row(values: dict[str, object]) -> str:
    """One data row: the given columns, every other column empty (as in sparse real files)."""
    return ",".join(
        "" if values.get(name) is None else str(values[name]) for name in SENSEURCITY_COLUMNS
    )

"""The verdict of a cluster run: per sensor, which periods had to be calibrated, which are in
the calibrated stream, which are missing (gaps) and which are there more than once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

__all__ = [
    "SensorTally",
    "expected_periods",
    "format_verdict",
    "reading_key",
    "readings_lost_and_duplicated",
    "tally",
]


@dataclass(frozen=True, slots=True)
class SensorTally:
    sensor: str
    expected: int
    calibrated: int  # distinct expected periods found
    missing: tuple[int, ...]  # period starts, Unix s
    duplicates: int  # stored copies beyond the first

    @property
    def clean(self) -> bool:
        return not self.missing and not self.duplicates


def expected_periods(sent: Iterable[tuple[str, float]], period_s: int) -> dict[str, set[int]]:
    """Every period a sensor sent a reading in, but its last (still open when the run ends)."""
    periods: dict[str, set[int]] = {}
    for sensor, timestamp in sent:
        periods.setdefault(sensor, set()).add(int(timestamp // period_s) * period_s)
    return {sensor: starts - {max(starts)} for sensor, starts in periods.items()}


def tally(
    expected: Mapping[str, set[int]], calibrated_ids: Iterable[str], feature: str = "pm10"
) -> dict[str, SensorTally]:
    """Calibrated message ids are ``<sensor>.<feature>.<period start>``."""
    counts: Counter[tuple[str, int]] = Counter()
    for msg_id in calibrated_ids:
        sensor, found_feature, start = msg_id.rsplit(".", 2)
        if found_feature == feature:
            counts[(sensor, int(start))] += 1
    result = {}
    for sensor, starts in sorted(expected.items()):
        found = {start for start in starts if counts[(sensor, start)]}
        result[sensor] = SensorTally(
            sensor=sensor,
            expected=len(starts),
            calibrated=len(found),
            missing=tuple(sorted(starts - found)),
            duplicates=sum(n - 1 for (s, _), n in counts.items() if s == sensor and n > 1),
        )
    return result


def reading_key(subject: str, document: Mapping[str, object]) -> tuple[str, float]:
    """(sensor, Unix s) of a stored reading: the sensor from the subject's last token, the time
    from the payload's ``ts`` (Unix s) or ``timestamp`` (ISO-8601)."""
    sensor = subject.rsplit(".", 1)[1]
    stamp = document.get("ts")
    if isinstance(stamp, int | float):
        return sensor, float(stamp)
    text = str(document.get("timestamp", ""))
    return sensor, datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def readings_lost_and_duplicated(
    sent: Iterable[tuple[str, float]], stored: Iterable[tuple[str, float]]
) -> tuple[int, int]:
    """Readings sent but not in the stream, and stored copies beyond the first."""
    counts = Counter(stored)
    lost = sum(1 for key in set(sent) if not counts[key])
    return lost, sum(n - 1 for n in counts.values() if n > 1)


def format_verdict(tallies: Mapping[str, SensorTally]) -> list[str]:
    lines = [f"{'sensor':<10}{'periods':>9}{'calibrated':>12}{'gaps':>7}{'duplicates':>12}"]
    for item in tallies.values():
        lines.append(
            f"{item.sensor:<10}{item.expected:>9}{item.calibrated:>12}"
            f"{len(item.missing):>7}{item.duplicates:>12}"
        )
    return lines

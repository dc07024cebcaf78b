"""One start-up check's outcome (tesla_gateway/daemon/preflight.py runs them all).

Apart from the checks so that each group of checks can live in its own module.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Finding", "Severity"]


class Severity(enum.StrEnum):
    OK = "ok"
    WARNING = "warning"
    DEGRADED = "degraded"
    FATAL = "fatal"


@dataclass(frozen=True, slots=True)
class Finding:
    """One check: what was checked, how it came out, and what to do about it."""

    check: str
    severity: Severity
    detail: str

    @property
    def passed(self) -> bool:
        return self.severity in (Severity.OK, Severity.WARNING)

"""What became of one reading in one model's windows: counted per model, seen by the monitor.

Its own module so that what reads outcomes (clock sanity, the monitor, the ticker) needs no ring.
"""

from __future__ import annotations

import enum

__all__ = ["AddOutcome"]


class AddOutcome(enum.StrEnum):
    """What happened to one reading in one model's windows."""

    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"  # same sensor and timestamp already averaged into the open period
    LATE = "late"  # its period was already closed; counted, never re-opened
    IRRELEVANT = "irrelevant"  # carries none of the model's channels (or, for a new sensor of
    # a model that has a sibling with fewer channels, not all of them)
    # for a period the gateway clock has not reached: waits (tesla_gateway.ingest.clock_sanity)
    HELD = "held"
    CLOCK_OUTLIER = "clock_outlier"  # a held reading the sensor's next reading contradicted

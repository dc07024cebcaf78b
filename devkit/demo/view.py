"""The live terminal view: plain ANSI redraws on a terminal, periodic plain lines otherwise."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TextIO

from devkit.demo.nodes import ReplayClock
from devkit.demo.scoreboard import Scoreboard

__all__ = ["LiveView", "format_time"]

_TTY_REFRESH_S = 0.25
_PLAIN_EVERY_S = 10.0
_HOME_CLEAR = "\x1b[H\x1b[J"
_HIDE_CURSOR = "\x1b[?25l"
_SHOW_CURSOR = "\x1b[?25h"
_BOLD, _DIM, _GREEN, _YELLOW, _RESET = "\x1b[1m", "\x1b[2m", "\x1b[32m", "\x1b[33m", "\x1b[0m"


def format_time(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%d %H:%M UTC")


def _num(value: float | None, width: int = 7) -> str:
    if value is None or not math.isfinite(value):
        return "—".rjust(width)
    return f"{value:{width}.1f}"


class LiveView:
    """Draws the scoreboard until cancelled; ``tty`` picks redraws or plain lines."""

    def __init__(
        self,
        scoreboard: Scoreboard,
        clock: ReplayClock,
        out: TextIO,
        *,
        tty: bool,
        header: str,
        history_end: float,
        window_length: int,
        check: Callable[[], None],
        calibrates_from: int | None = None,
    ) -> None:
        self._board = scoreboard
        self._clock = clock
        self._out = out
        self._tty = tty
        self._header = header
        self._history_end = history_end
        self._window_length = window_length
        self._calibrates_from = window_length if calibrates_from is None else calibrates_from
        self._check = check  # raises if something the demo depends on has died

    async def run(self) -> None:
        if self._tty:
            self._out.write(_HIDE_CURSOR)
        try:
            while True:
                self._check()
                if self._tty:
                    self._out.write(_HOME_CLEAR + self.render(color=True) + "\n")
                else:
                    self._out.write(self.plain_lines() + "\n")
                self._out.flush()
                await asyncio.sleep(_TTY_REFRESH_S if self._tty else _PLAIN_EVERY_S)
        finally:
            if self._tty:
                self._out.write(_SHOW_CURSOR)
                self._out.flush()

    def _progress(self) -> str:
        clock = self._clock
        elapsed = min(max(time.monotonic() - clock.wall_start, 0.0), clock.wall_seconds)
        history = min(max(clock.history_now(), clock.history_start), self._history_end)
        return (
            f"replay clock {format_time(history)}  ({elapsed:4.0f} s of {clock.wall_seconds:.0f} s)"
        )

    def render(self, *, color: bool) -> str:
        bold, dim, green, yellow, reset = (
            (_BOLD, _DIM, _GREEN, _YELLOW, _RESET) if color else ("", "", "", "", "")
        )
        lines = [f"{bold}{self._header}{reset}", self._progress(), ""]
        lines.append(
            f"{'sensor':<8} {'link':<6} {'time (UTC)':<11} {'raw':>7} {'calib.':>7} "
            f"{'ref.':>7}  {'quality':<11} {'n':>5}  {'RMSE raw':>8} {'RMSE cal':>8} "
            f"{'MAE raw':>8} {'MAE cal':>8}"
        )
        for score in self._board.sensors.values():
            latest = score.latest
            quality = ",".join(latest.quality) if latest else "waiting"
            shade = green if quality == "ok" else yellow
            when = (
                datetime.fromtimestamp(latest.period_start, UTC).strftime("%d %H:%M")
                if latest
                else "—"
            )
            lines.append(
                f"{score.sensor_id:<8} {score.link:<6} {when:<11} "
                f"{_num(latest.raw if latest else None)} "
                f"{_num(latest.calibrated if latest else None)} "
                f"{_num(latest.reference if latest else None)}  "
                f"{shade}{quality:<11}{reset} {score.scored:>5}  "
                f"{_num(score.rmse_raw, 8)} {bold}{_num(score.rmse_calibrated, 8)}{reset} "
                f"{_num(score.mae_raw, 8)} {_num(score.mae_calibrated, 8)}"
            )
        lines += [
            "",
            f"{dim}µg/m³; errors against the station reference over the n calibrated periods; "
            + (
                f"the first {self._window_length - 1} periods of each sensor are warm-up."
                if self._calibrates_from >= self._window_length
                else f"calibrated from period {self._calibrates_from}, with the history the "
                f"sensor has; its window is whole after {self._window_length} periods."
            )
            + reset,
        ]
        return "\n".join(lines)

    def final_frame(self) -> str:
        """The last state: redrawn in place on a terminal, appended otherwise."""
        return _HOME_CLEAR + self.render(color=True) if self._tty else self.render(color=False)

    def plain_lines(self) -> str:
        parts = [self._progress()]
        for score in self._board.sensors.values():
            latest = score.latest
            parts.append(
                f"  {score.sensor_id} ({score.link}): {len(score.outputs)} periods back, "
                f"{score.calibrated} calibrated, {score.warming_up} warm-up; "
                f"RMSE raw {_num(score.rmse_raw, 0).strip()} "
                f"cal {_num(score.rmse_calibrated, 0).strip()}"
                + (f"; latest {','.join(latest.quality)}" if latest else "")
            )
        return "\n".join(parts)

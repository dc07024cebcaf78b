"""How long to wait after losing a connection, and how the loss is told to the operator.

Measured against a real mosquitto: two gateways with one client id (a copied SD card or
config gives two Pis the same ``gateway_id``, hence the same client ids) took each other's
session over about 50 times a second under MQTT 5 and 11 times a second under 3.1.1, each time
with a log line and a session hand-over that cuts the other connection mid-flight, because a
loss after a successful connection was followed by an immediate reconnect.

So a connection that ends soon after its CONNACK counts as a failed attempt: the next attempt
waits, and the wait doubles up to ``reconnect_max_s`` (the same backoff as a refused
connection); a connection that lasted :data:`STABLE_AFTER_S` resets it and reconnects at once,
as before. An MQTT 5 broker says why it closed a connection: ``Session taken over`` (reason
code 0x8E) means another client connected with this client id, which the gateway reports as an
error with what to change. Mosquitto 2.0.11 (Debian bookworm) sends no reason even to an MQTT 5
client, and MQTT 3.1.1 has none: there a run of short connections is reported with the same
hint. Repeats are reported at most every :data:`REPORT_INTERVAL_S` (debug in between).

A broker that cannot be reached (refused, wrong password, TLS, timeout) is the same story: the
first failed attempt is a warning at once, and while the failures last a warning every
:data:`REPORT_INTERVAL_S` with the attempts so far and the last error, so a daemon that has
not reached its broker for an hour says so in the log of that hour, not only at its start.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard

from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.reasoncodes import ReasonCode
from structlog.typing import FilteringBoundLogger

__all__ = [
    "RECENT_TAKEOVER_S",
    "SESSION_TAKEN_OVER",
    "STABLE_AFTER_S",
    "FailureDecision",
    "LossDecision",
    "SessionLossPolicy",
    "reason_name",
    "report_connect_failure",
    "report_loss",
    "session_problems",
    "taken_over_message",
]

SESSION_TAKEN_OVER = 0x8E  # MQTT 5 DISCONNECT reason code: another client took the session
STABLE_AFTER_S = 10.0  # a connection that lasted this long ended for another reason
REPORT_INTERVAL_S = 60.0  # a repeating loss is reported (error/warning) at most this often
UNSTABLE_HINT_AFTER = 3  # short connections in a row before the 3.1.1 hint is given
RECENT_TAKEOVER_S = 600.0  # the service's status line names a takeover this recent


def taken_over_message(client_id: str) -> str:
    """What the operator reads when another client holds this client id."""
    return (
        f"another client connected to the broker with this connection's client id "
        f"{client_id!r}, so the broker closed this one: a second gateway with the same "
        f"gateway_id (a copied SD card or config?) or another program using that client id. "
        f"Give each gateway its own gateway_id (or set client_id)."
    )


def session_problems(
    sessions: Mapping[str, object], now: float, within_s: float = RECENT_TAKEOVER_S
) -> list[str]:
    """What the status line and ``tesla-gateway status`` say about the connections' sessions
    (``sessions``: name -> :meth:`SessionLossPolicy.stats`): a takeover within ``within_s`` of
    ``now``, or a run of connections the broker closed right after accepting them."""
    problems = []
    for name, session in sorted(sessions.items()):
        if not isinstance(session, Mapping):
            continue
        when, taken = session.get("last_taken_over"), session.get("taken_over")
        in_a_row = session.get("unstable_in_a_row")
        if _number(when) and now - when <= within_s:
            problems.append(
                f"mqtt {name}: session taken over by another client with its client id "
                f"({taken} time(s) in all)"
            )
        elif _number(in_a_row) and in_a_row >= UNSTABLE_HINT_AFTER:
            problems.append(
                f"mqtt {name}: the broker closed {in_a_row} connections in a row right after "
                f"accepting them (another client with its client id?)"
            )
    return problems


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True)
class LossDecision:
    """What to do after one lost connection."""

    wait_s: float  # before the next attempt (0: reconnect at once)
    taken_over: bool  # the broker said another client took this session
    unstable: bool  # ended within STABLE_AFTER_S of its CONNACK (or taken over)
    in_a_row: int  # unstable losses in a row, this one included (0 when stable)
    report: bool  # log at warning/error level (otherwise debug: rate-limited)


@dataclass(frozen=True, slots=True)
class FailureDecision:
    """What to do after one failed connection attempt."""

    wait_s: float  # before the next attempt
    attempts: int  # failed attempts in a row, this one included
    failing_for_s: float  # since the first of them
    report: bool  # log at warning level (otherwise debug: rate-limited)


@dataclass
class SessionLossPolicy:
    """Backoff and counters over one supervised connection's attempts (event loop only)."""

    initial_s: float
    max_s: float
    monotonic: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    lost: int = 0
    taken_over: int = 0
    last_taken_over_at: float | None = None  # wall-clock time of the last takeover
    _delay_s: float = field(default=0.0, init=False)
    _in_a_row: int = field(default=0, init=False)
    _next_report: float = field(default=float("-inf"), init=False)
    _failed_in_a_row: int = field(default=0, init=False)
    _failing_since: float = field(default=0.0, init=False)
    _next_failure_report: float = field(default=float("-inf"), init=False)

    def __post_init__(self) -> None:
        self._delay_s = self.initial_s

    def after_failed_attempt(self) -> float:
        """Seconds to wait after a refused or failed attempt; the next wait doubles."""
        wait = self._delay_s
        self._delay_s = min(self._delay_s * 2, self.max_s)
        return wait

    def after_connect_failure(self) -> FailureDecision:
        """Account for an attempt that did not connect: the first of a run is reported, then
        one every :data:`REPORT_INTERVAL_S` while the run lasts."""
        now = self.monotonic()
        if self._failed_in_a_row == 0:
            self._failing_since = now
        self._failed_in_a_row += 1
        report = now >= self._next_failure_report
        if report:
            self._next_failure_report = now + REPORT_INTERVAL_S
        return FailureDecision(
            self.after_failed_attempt(),
            attempts=self._failed_in_a_row,
            failing_for_s=now - self._failing_since,
            report=report,
        )

    def after_connected(self) -> int:
        """A successful CONNACK ends a run of failed attempts (the next failure is reported at
        once); how many attempts had failed before it."""
        failed, self._failed_in_a_row = self._failed_in_a_row, 0
        self._next_failure_report = float("-inf")
        return failed

    def after_loss(self, *, lasted_s: float, reason_code: int | None) -> LossDecision:
        """Account for a lost connection that lasted ``lasted_s`` after its CONNACK."""
        self.lost += 1
        taken_over = reason_code == SESSION_TAKEN_OVER
        if taken_over:
            self.taken_over += 1
            self.last_taken_over_at = self.wall_clock()
        unstable = taken_over or lasted_s < STABLE_AFTER_S
        if not unstable:
            self._in_a_row = 0
            self._delay_s = self.initial_s
            return LossDecision(0.0, taken_over=False, unstable=False, in_a_row=0, report=True)
        self._in_a_row += 1
        now = self.monotonic()
        # The first of a run is reported, and the one that makes the 3.1.1 hint worth giving.
        hint_due = not taken_over and self._in_a_row == UNSTABLE_HINT_AFTER
        report = now >= self._next_report or hint_due
        if report:
            self._next_report = now + REPORT_INTERVAL_S
        return LossDecision(
            self.after_failed_attempt(),
            taken_over=taken_over,
            unstable=True,
            in_a_row=self._in_a_row,
            report=report,
        )

    def stats(
        self, connections: int, *, connected_for_s: float | None
    ) -> dict[str, int | float | None]:
        """Counters for the stats topic, keyed as documented in docs/mqtt.md; a connection up
        for :data:`STABLE_AFTER_S` (``connected_for_s``; None: not connected) ends the run of
        unstable ones."""
        stable_now = connected_for_s is not None and connected_for_s >= STABLE_AFTER_S
        return {
            "connections": connections,
            "lost": self.lost,
            "taken_over": self.taken_over,
            "last_taken_over": self.last_taken_over_at,
            "unstable_in_a_row": 0 if stable_now else self._in_a_row,
        }


def report_loss(
    policy: SessionLossPolicy,
    log: FilteringBoundLogger,
    *,
    client_id: str,
    lasted_s: float,
    reason_code: int | None,
) -> float:
    """Account for a lost connection and log it as what it was (a takeover, a run of short
    connections or a plain loss); the seconds to wait before reconnecting."""
    decision = policy.after_loss(lasted_s=lasted_s, reason_code=reason_code)
    fields: dict[str, Any] = {
        "lasted_s": round(lasted_s, 1),
        "retry_in_s": decision.wait_s,
        "reason": reason_name(reason_code),
    }
    if decision.taken_over:
        report = log.error if decision.report else log.debug
        report(
            "mqtt_session_taken_over",
            error=taken_over_message(client_id),
            taken_over=policy.taken_over,
            **fields,
        )
    elif decision.unstable:
        if decision.in_a_row >= UNSTABLE_HINT_AFTER:
            fields["hint"] = (
                "the broker keeps closing this connection right after accepting it; "
                + taken_over_message(client_id)
            )
        report = log.warning if decision.report else log.debug
        report("mqtt_connection_unstable", in_a_row=decision.in_a_row, **fields)
    else:
        log.warning("mqtt_connection_lost", **fields)
    return decision.wait_s


def report_connect_failure(
    policy: SessionLossPolicy, log: FilteringBoundLogger, *, error: str
) -> float:
    """Account for a failed attempt and log it (a warning at most every
    :data:`REPORT_INTERVAL_S`, debug in between); the seconds to wait before the next one."""
    decision = policy.after_connect_failure()
    report = log.warning if decision.report else log.debug
    report(
        "mqtt_connect_failed",
        error=error,
        attempts=decision.attempts,
        failing_for_s=round(decision.failing_for_s, 1),
        retry_in_s=decision.wait_s,
    )
    return decision.wait_s


def reason_name(code: int | None) -> str | None:
    """The DISCONNECT reason's name (MQTT 5), e.g. 'Session taken over'; None without one."""
    if code is None:
        return None
    try:
        return str(ReasonCode(PacketTypes.DISCONNECT, identifier=code))
    except (KeyError, ValueError):
        return f"reason code {code}"

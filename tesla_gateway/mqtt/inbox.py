"""Received messages, and the bounded inbox that hands them from paho to the event loop.

Receiving is the gateway's hot path (thousands of readings per second, one message each), so
messages cross from paho's thread to the event loop in batches: the thread appends under a lock
and wakes the loop only when the inbox was empty (one wake-up per burst, not one
``call_soon_threadsafe`` per message).

The inbox is bounded by ``max_inbox`` messages, counting those the event loop has taken but not
yet handled, because a publisher can send faster than the gateway can calibrate: unbounded, a
QoS 0 flood of 2,000,000 messages grew the daemon from 72 to 755 MB (issue 12). Beyond the bound
a QoS 0 message is dropped and counted (:meth:`Inbox.stats`, and a rate-limited log); a QoS 1/2
message is held in paho's thread, which then stops reading the socket until there is room: the
message is not acknowledged, so the broker keeps it (and, past its own in-flight limit, sends no
more). In event-loop mode the loop cannot wait for itself: the socket is not read again until
there is room (module doc of :mod:`tesla_gateway.mqtt.loop_io`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from structlog.typing import FilteringBoundLogger

from tesla_gateway.mqtt.attempt import Attempt

__all__ = ["Delivery", "InboundMessage", "Inbox", "MessageHandler"]


class InboundMessage(NamedTuple):
    """A message received on a subscription (immutable; a named tuple is built in half the
    time of a frozen dataclass, and one is built per message)."""

    topic: str
    payload: bytes
    qos: int
    retain: bool


MessageHandler = Callable[[InboundMessage], Awaitable[None]]


class Delivery(NamedTuple):
    """A received message with what acknowledging it needs: its attempt and packet id."""

    attempt: Attempt
    mid: int
    message: InboundMessage


_COALESCE_BELOW = 16  # messages waiting: fewer than this, and the dispatcher waits _COALESCE_S
_COALESCE_S = 0.002
# A held-back message rechecks the room and the connection at least this often (a wake-up the
# loop's unlocked look at _waiting can miss costs at most this long).
_HOLD_POLL_S = 0.05
_DROP_LOG_INTERVAL_S = 10.0  # QoS 0 drops are logged at most this often


class Inbox:
    """The hand-off of received messages to the event loop, bounded by ``max_inbox``.

    :meth:`put` runs where paho calls back (its thread, or the loop in event-loop mode); every
    other method runs on the event loop. ``pause_reading`` is given in event-loop mode: how to
    stop reading an attempt's socket when the inbox is full (the loop cannot wait for room).
    """

    def __init__(
        self,
        max_inbox: int,
        log: FilteringBoundLogger,
        pause_reading: Callable[[Attempt], None] | None = None,
    ) -> None:
        if max_inbox < 1:
            raise ValueError(f"max_inbox must be at least 1, got {max_inbox}")
        self._max = max_inbox
        self._log = log
        self._pause_reading = pause_reading
        # ``_in_hand`` (written by the loop only) counts messages taken from the inbox and not
        # yet handled; the bound applies to both together.
        self._queue: deque[Delivery] = deque()
        self._lock = threading.Lock()
        self._room = threading.Condition(self._lock)
        self._signalled = False
        self._ready = asyncio.Event()
        self._in_hand = 0
        self._waiting = 0  # paho threads holding a message back for room
        self._peak = 0
        self._dropped = 0  # QoS 0 messages dropped at the bound
        self._held = 0  # QoS 1/2 messages held back at the bound (back-pressure)
        self._drops_logged = 0
        self._next_drop_log = 0.0

    def stats(self) -> dict[str, int]:
        """Waiting now, the most ever waiting, the bound, QoS 0 messages dropped at the bound
        and QoS 1/2 messages held back (left at the broker) at it."""
        return {
            "buffered": len(self._queue) + self._in_hand,
            "peak": self._peak,
            "max": self._max,
            "dropped_qos0": self._dropped,
            "held_back": self._held,
        }

    # -- where paho calls back -------------------------------------------------------------

    def put(self, delivery: Delivery) -> bool:
        """Add a received message (or drop it, or wait for room: module doc).

        True when the loop must be woken (:meth:`wake`): the first message since it last took.
        """
        queue = self._queue
        with self._lock:
            if len(queue) + self._in_hand >= self._max and not self._make_room(
                delivery.attempt, delivery.message.qos
            ):
                return False
            queue.append(delivery)
            self._peak = max(self._peak, len(queue) + self._in_hand)
            if self._signalled:
                return False
            self._signalled = True
        return True

    def wake(self) -> None:
        """Tell the dispatcher there are messages (on the event loop)."""
        self._ready.set()

    def _make_room(self, attempt: Attempt, qos: int) -> bool:
        """Lock held, inbox full: may this message go in?

        QoS 0: no, it is dropped and counted. QoS 1/2: wait, holding it (paho's thread reads
        no more from the socket meanwhile), until the loop has made room; False if the attempt
        was given up meanwhile (unacknowledged, the broker redelivers it).
        """
        pause = self._pause_reading
        if qos == 0:
            self._dropped += 1
            if pause is not None:
                # Reading on and dropping here would take the loop's time from the readings
                # already in (a 2,000,000-message flood: 33,070 ingested, against 799,409 with
                # the thread): stop reading until there is room; the broker's queue takes the
                # excess (and drops it past its limit: seen through the senders' seq).
                pause(attempt)
            return False
        self._held += 1
        if pause is not None:
            # The loop cannot wait for itself: this message goes in (one over the bound) and
            # the socket is read no more until the dispatcher has made room; the broker keeps
            # the rest unacknowledged.
            pause(attempt)
            return True
        self._waiting += 1
        try:
            while len(self._queue) + self._in_hand >= self._max:
                if attempt.released.is_set():
                    return False
                self._room.wait(_HOLD_POLL_S)
        finally:
            self._waiting -= 1
        return not attempt.released.is_set()

    # -- the event loop --------------------------------------------------------------------

    async def next_batch(self) -> list[Delivery]:
        """Wait for messages and take all that are waiting; they count as in hand until
        :meth:`handled_one` is called for each."""
        await self._ready.wait()
        if len(self._queue) < _COALESCE_BELOW:
            # Sensors spread over time arrive one message per wake-up; waiting a moment
            # lets a batch form (one wake-up and one acknowledgement write for all).
            await asyncio.sleep(_COALESCE_S)
        with self._lock:
            batch = list(self._queue)
            self._queue.clear()
            self._in_hand = len(batch)
            self._signalled = False
            self._ready.clear()
        self._log_drops()
        return batch

    def handled_one(self) -> None:
        """One message taken by :meth:`next_batch` is handled: a held-back one may come in."""
        self._in_hand -= 1
        if self._waiting:  # paho's thread holds a message back: there is room now
            with self._lock:
                self._room.notify_all()

    def has_room(self) -> bool:
        """Below the bound (a paused socket may be read again)."""
        return len(self._queue) + self._in_hand < self._max

    def release(self, attempt: Attempt) -> None:
        """``attempt`` is given up: a message held back for it is let go, unacknowledged."""
        with self._lock:
            attempt.released.set()
            self._room.notify_all()

    def _log_drops(self) -> None:
        """Log QoS 0 drops at the bound, at most once per _DROP_LOG_INTERVAL_S."""
        dropped = self._dropped
        if dropped == self._drops_logged or time.monotonic() < self._next_drop_log:
            return
        self._log.warning(
            "mqtt_inbox_full_dropped",
            qos=0,
            dropped=dropped - self._drops_logged,
            dropped_total=dropped,
            max_inbox=self._max,
        )
        self._drops_logged = dropped
        self._next_drop_log = time.monotonic() + _DROP_LOG_INTERVAL_S

"""One partition's pinned pull loop over raw ``$JS.API`` requests (nats-py 2.16 cannot say
``group`` or ``id`` in a pull).

The first message carries the pin (``Nats-Pin-Id``); every later pull names it, so the server
answers 423 the moment another gateway holds the pin: then the partition is lost and the loop
ends. Pulls expire well inside the pin TTL, so a live owner keeps its pin.

A partition given back is :meth:`PartitionPuller.stop`-ped, not cancelled: its last pull stays
at the server until it expires whatever the client does (a server with a leaf-node or gateway
listener counts a pull younger than 2 s as wanted even once its inbox is gone), and a reading
landing in that orphan pinned the partition to nobody for the pin TTL. So the pull is waited out
with its inbox open and what it brings is handled as usual; for a partition lost to another
gateway it is refused instead (redelivered once the pull is over) and a pin it took given up.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

from tesla_gateway.cluster.cancels import checkpoint
from tesla_gateway.cluster.engine import GROUP, Engine, transient

if TYPE_CHECKING:
    from nats.aio.msg import Msg

__all__ = ["PartitionPuller", "PinLostError", "StreamMessage"]

_log = structlog.get_logger(__name__)
_NS = 1_000_000_000
_PULL_ENDS = {"100", "404", "408", "409"}  # heartbeat, no messages, expired, over (a leader moved)
_REFUSED_PAUSE_S = 0.5


class PinLostError(Exception):
    """The server pinned this partition's consumer to another gateway (status 423)."""


@dataclass(frozen=True, slots=True)
class StreamMessage:
    """A delivered reading message: its subject, bytes, stream sequence and stream time."""

    subject: str
    data: bytes
    sequence: int
    timestamp: float  # when the stream stored it (Unix s)


Handler = Callable[[list[StreamMessage]], None]  # feeds the windows, synchronously


class PartitionPuller:
    """Pulls one partition while this gateway holds its pin; ends on :class:`PinLostError`."""

    def __init__(
        self,
        engine: Engine,
        partition: int,
        handler: Handler,
        *,
        batch: int = 500,
        expires_s: float = 1.0,
    ) -> None:
        self._engine = engine
        self.partition = partition
        self._handler = handler
        self._batch = batch
        self._expires_s = expires_s
        self.pin_id: str | None = None
        self.delivered = 0
        self._stopping = False
        self._refusing = False
        self._pin_when_refused: str | None = None

    def stop(self, *, refuse: bool = False) -> None:
        """Publish no further pull: :meth:`run` returns once the waiting one has ended (its
        expiry, at most ``expires_s`` + 2 s), its messages handled and acknowledged; with
        ``refuse`` (the partition is another gateway's) they are NAKed for redelivery after
        that pull instead, and a pin that pull took is given up."""
        self._stopping = True
        if refuse and not self._refusing:
            self._refusing, self._pin_when_refused = True, self.pin_id

    async def run(self) -> None:
        config = self._engine.subjects.config
        consumer = self._engine.subjects.consumer(self.partition)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{config.readings_stream}.{consumer}"
        inbox = self._engine.nc.new_inbox()
        arrived: asyncio.Queue[Msg] = asyncio.Queue()
        subscription = await self._engine.nc.subscribe(inbox, cb=arrived.put)
        try:
            while not self._stopping:
                checkpoint()  # a cancellation a reply swallowed: no further pull
                request: dict[str, object] = {
                    "batch": self._batch,
                    "expires": int(self._expires_s * _NS),
                    "group": GROUP,
                }
                if self.pin_id is not None:
                    request["id"] = self.pin_id
                await self._engine.nc.publish(subject, json.dumps(request).encode(), reply=inbox)
                await self._one_pull(arrived)
            if self._refusing and self.pin_id != self._pin_when_refused:  # the pin is ours
                with contextlib.suppress(*transient()):  # else it ends with the pin TTL
                    await self._engine.unpin(self.partition)
        finally:
            with contextlib.suppress(*transient()):  # a closed connection has no interest left
                await subscription.unsubscribe()

    async def _status(self, status: str, message: Msg) -> bool:
        """A status message: True when it ends the pull; 423 raises :class:`PinLostError`."""
        if status == "423":
            raise PinLostError(f"partition {self.partition}: pinned elsewhere")
        if status not in _PULL_ENDS:  # a refusal: do not ask again at once
            _log.warning(
                "cluster_pull_refused",
                partition=self.partition,
                status=status,
                description=(message.headers or {}).get("Description"),
            )
            await asyncio.sleep(_REFUSED_PAUSE_S)
        return status != "100"  # 408 expired, 404/409 and refusals: this pull is over

    async def _one_pull(self, arrived: asyncio.Queue[Msg]) -> None:
        """Take one pull's messages (handled in runs as they come) until it ends."""
        received = 0
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._expires_s + 2.0  # a pull lost in a leader change
        while received < self._batch:
            try:
                async with asyncio.timeout(max(deadline - loop.time(), 0.0)):
                    message = await arrived.get()
            except TimeoutError:
                return
            messages = [message]
            while not arrived.empty() and len(messages) < self._batch - received:
                messages.append(arrived.get_nowait())
            data: list[StreamMessage] = []
            ended = False
            for message in messages:
                status = (message.headers or {}).get("Status")
                if status is not None and not message.data:
                    ended = await self._status(status, message) or ended
                    continue
                pin = (message.headers or {}).get("Nats-Pin-Id")
                if pin is not None and pin != self.pin_id:
                    self.pin_id = pin
                metadata = message.metadata
                data.append(
                    StreamMessage(
                        subject=message.subject,
                        data=message.data,
                        sequence=metadata.sequence.stream,
                        timestamp=metadata.timestamp.timestamp(),
                    )
                )
            if data:
                received += len(data)
                answer = b"+ACK"
                if self._refusing:  # for the owner, once this pull is over
                    answer = b'-NAK {"delay": %d}' % int((self._expires_s + 1.0) * _NS)
                else:
                    self.delivered += len(data)
                    self._handler(data)
                # explicit acks, one per message, after the windows hold them
                for message in messages:
                    if message.reply:
                        await self._engine.nc.publish(message.reply, answer)
            if ended:
                return

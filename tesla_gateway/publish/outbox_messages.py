"""What the outbox holds: a message to queue, a queued message named by its id, and a stored
row read back as one.

A row is read back totally: damage on disk can leave any value of any type in any column, so a
row whose fields are not what :meth:`~tesla_gateway.publish.outbox.Outbox.append` wrote (wrong
types, text that is not UTF-8, a topic MQTT would refuse) is not a message, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OutboxMessage", "QueuedMessage", "stored_message"]

_MAX_TOPIC = 65_535  # an MQTT topic is at most 65,535 bytes


@dataclass(frozen=True, slots=True)
class OutboxMessage:
    """A message to deliver."""

    topic: str
    payload: bytes
    qos: int = 1
    retain: bool = False


@dataclass(frozen=True, slots=True)
class QueuedMessage:
    """A message in the queue; ``id`` orders delivery and names it for
    :meth:`~tesla_gateway.publish.outbox.Outbox.remove`."""

    id: int
    topic: str
    payload: bytes
    qos: int
    retain: bool


def stored_message(row: tuple[object, ...]) -> QueuedMessage | None:
    """The row as a message, or None if any field is not what was written.

    The row is ``id, CAST(topic AS BLOB), typeof(topic), payload, typeof(payload), qos,
    retain``: the topic as bytes (UTF-8 checked here, not by the sqlite3 module) and the storage
    class of each value.
    """
    row_id, topic, topic_type, payload, payload_type, qos, retain = row
    if not isinstance(row_id, int) or topic_type != "text" or payload_type != "blob":
        return None
    if not isinstance(topic, bytes) or not isinstance(payload, bytes) or len(topic) > _MAX_TOPIC:
        return None
    if qos not in (0, 1, 2) or retain not in (0, 1) or isinstance(qos, bool):
        return None
    try:
        text = topic.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not text or "\0" in text or "+" in text or "#" in text:
        return None
    return QueuedMessage(id=row_id, topic=text, payload=payload, qos=int(qos), retain=bool(retain))

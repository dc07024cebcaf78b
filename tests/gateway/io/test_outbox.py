"""The persisted outbox: FIFO order, the bound (oldest dropped and counted), restarts."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from gateway.outbox import Outbox, OutboxMessage


def message(n: int) -> OutboxMessage:
    return OutboxMessage(topic=f"t/{n}", payload=str(n).encode(), qos=1, retain=n % 2 == 0)


def test_fifo_and_removal_only_of_acknowledged(tmp_path: Path) -> None:
    with Outbox.open(tmp_path / "o.sqlite3", max_messages=100) as outbox:
        assert outbox.append([message(n) for n in range(5)]) == 0
        batch = outbox.peek(3)
        assert [m.payload for m in batch] == [b"0", b"1", b"2"]
        assert [m.retain for m in batch] == [True, False, True]
        outbox.remove([batch[0].id, batch[1].id])  # the third was not acknowledged
        assert [m.payload for m in outbox.peek(10)] == [b"2", b"3", b"4"]
        assert len(outbox) == 3


def test_peek_after_continues_behind_messages_already_sent(tmp_path: Path) -> None:
    with Outbox.open(tmp_path / "o.sqlite3", max_messages=100) as outbox:
        outbox.append([message(n) for n in range(5)])
        first = outbox.peek_after(0, 2)
        assert [m.payload for m in first] == [b"0", b"1"]
        assert [m.payload for m in outbox.peek_after(first[-1].id, 10)] == [b"2", b"3", b"4"]
        assert len(outbox) == 5  # peeking removes nothing


def test_bound_drops_oldest_and_counts_them_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=10) as outbox:
        assert outbox.append([message(n) for n in range(8)]) == 0
        assert outbox.append([message(n) for n in range(8, 13)]) == 3
        assert [m.payload for m in outbox.peek(100)] == [str(n).encode() for n in range(3, 13)]
        assert outbox.dropped_total == 3
    with Outbox.open(path, max_messages=10) as reopened:
        assert [m.payload for m in reopened.peek(100)] == [str(n).encode() for n in range(3, 13)]
        assert reopened.dropped_total == 3
        assert reopened.append([message(13)]) == 1
        assert reopened.dropped_total == 4


def test_corrupt_file_is_set_aside_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    path.write_bytes(b"this is not a database" * 100)
    with capture_logs() as logs, Outbox.open(path, max_messages=10) as outbox:
        assert len(outbox) == 0
        outbox.append([message(1)])
    assert [log["event"] for log in logs] == ["state_file_set_aside"]
    assert list(tmp_path.glob("o.sqlite3.corrupt-*"))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 7), max_size=20), st.integers(1, 15))
def test_queue_is_always_the_newest_bound_messages_in_order(batches: list[int], bound: int) -> None:
    with (
        tempfile.TemporaryDirectory() as directory,
        Outbox.open(Path(directory) / "o.sqlite3", max_messages=bound) as outbox,
    ):
        sent, dropped = 0, 0
        for size in batches:
            dropped += outbox.append([message(n) for n in range(sent, sent + size)])
            sent += size
        expected = list(range(max(0, sent - bound), sent))
        assert [int(m.payload) for m in outbox.peek(1000)] == expected
        assert dropped == outbox.dropped_total == sent - len(expected)

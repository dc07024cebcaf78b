"""The persisted outbox: FIFO order, the bound (oldest dropped and counted), restarts."""

from __future__ import annotations

import contextlib
import resource
import signal
import sqlite3
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from tesla_gateway.publish.errors import OutboxError
from tesla_gateway.publish.outbox import Outbox
from tesla_gateway.publish.outbox_messages import OutboxMessage
from tesla_gateway.set_aside import SetAsideLog


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


def test_rows_that_are_not_messages_are_dropped_and_counted(tmp_path: Path) -> None:
    """Finding 4 of issue 12: such rows raised OperationalError or TypeError in the publisher."""
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=100) as outbox:
        outbox.append([message(1)])
    with sqlite3.connect(path) as db:  # what a damaged page can hold
        for values in (
            "CAST(x'742fff' AS TEXT), x'00', 1, 0",  # topic not UTF-8
            "'t/x', 'text, not a blob', 1, 0",
            "'t/x', 5, 1, 0",  # bytes(5) would have been five zero bytes
            "'t/x', x'00', 'one', 0",
            "'t/#', x'00', 1, 0",
            "'t/x', x'00', 1, 7",
        ):
            db.execute(
                f"INSERT INTO outbox (topic, payload, qos, retain, queued_at) VALUES ({values}, 0)"
            )
    with capture_logs() as logs, Outbox.open(path, max_messages=100) as outbox:
        outbox.append([message(2)])
        assert [m.payload for m in outbox.peek_after(0, 3)] == [b"1", b"2"]
        assert outbox.invalid_rows_dropped == 6
        assert len(outbox) == 2  # and they are gone from the file
    assert [log["event"] for log in logs].count("outbox_invalid_row_dropped") == 6


def damage_the_queue_page(path: Path) -> None:
    """Overwrite the outbox table's root page from another connection (checkpointed first)."""
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    (root,) = other.execute("SELECT rootpage FROM sqlite_master WHERE name='outbox'").fetchone()
    (page_size,) = other.execute("PRAGMA page_size").fetchone()
    with path.open("r+b") as raw:
        raw.seek((root - 1) * page_size)
        raw.write(b"\xa5" * page_size)
    other.execute("INSERT INTO counters (name, value) VALUES ('poke', 1)")
    other.close()


def test_corruption_met_while_reading_sets_the_file_aside_and_ids_continue(
    tmp_path: Path,
) -> None:
    path = tmp_path / "o.sqlite3"
    set_aside = SetAsideLog()
    with Outbox.open(path, max_messages=1000) as earlier:
        earlier.append([message(n) for n in range(100)])
    # Reopened with messages queued: read from the file (no in-memory copy of this queue).
    with Outbox.open(path, max_messages=1000, set_aside=set_aside) as outbox:
        in_flight = outbox.peek_after(0, 10)
        damage_the_queue_page(path)  # behind the open connection, which then reads it again
        assert outbox.peek_after(in_flight[-1].id, 10) == []  # a fresh queue, not an exception
        assert outbox.resets == 1 and set_aside.count == 1
        assert list(tmp_path.glob("o.sqlite3.corrupt-*"))
        outbox.append([message(200)])
        (new,) = outbox.peek(10)
        assert new.id > in_flight[-1].id  # an acknowledgement of an old id never removes it
        outbox.remove([m.id for m in in_flight])
        assert len(outbox) == 1


def test_a_disk_that_refuses_the_file_keeps_the_queue_in_memory_until_it_takes_it(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")  # mkdir fails: ENOTDIR/EEXIST
    now = [0.0]
    with Outbox.open(
        blocker / "o.sqlite3", max_messages=3, memory_fallback=True, clock=lambda: now[0]
    ) as outbox:
        assert outbox.in_memory and outbox.stats()["storage"] == "memory"
        assert outbox.append([message(n) for n in range(5)]) == 2  # the same bound
        assert outbox.stats()["memory_messages"] == 5
        queued = outbox.peek_after(0, 10)
        assert [m.payload for m in queued] == [b"2", b"3", b"4"]
        blocker.unlink()  # the disk takes files again
        now[0] = 10.0
        outbox.append([message(5)])  # not yet: memory holds messages that may be in flight
        assert outbox.in_memory
        outbox.remove([m.id for m in outbox.peek(10)])
        outbox.append([message(6)])  # drained: back to the file
        assert not outbox.in_memory and outbox.stats()["storage"] == "disk"
        assert [m.payload for m in outbox.peek_after(queued[-1].id, 10)] == [b"6"]
    with Outbox.open(blocker / "o.sqlite3", max_messages=3) as reopened:
        assert [m.payload for m in reopened.peek(10)] == [b"6"]


def refuse_writes(outbox: Outbox) -> None:
    """The file takes no new page from now on: the next write that needs one fails with
    SQLITE_FULL, as on a full disk (reading and a new connection are unaffected)."""
    outbox._storage.db.execute("PRAGMA max_page_count = 1")  # (raised to the current size)


def test_a_file_the_disk_stops_writing_hands_its_messages_to_memory(tmp_path: Path) -> None:
    """Issue 26 item 4: a write the disk refuses (SQLite rolls the transaction back itself)
    moves the queue to memory with every message of the file, ids kept: messages sent from the
    file are acknowledged in memory, the rest follow in order, then the new ones. Drained and
    back on its file, the file no longer holds them. (The refused write used to raise, or, when
    refused at the statement, set the file aside as corrupt.)"""
    path = tmp_path / "o.sqlite3"
    now = [0.0]
    set_aside = SetAsideLog()
    with Outbox.open(
        path, max_messages=6, set_aside=set_aside, memory_fallback=True, clock=lambda: now[0]
    ) as outbox:
        assert outbox.append([message(n) for n in range(7)]) == 1  # the file's count: 1
        in_flight = outbox.peek_after(0, 2)
        refuse_writes(outbox)
        with capture_logs() as logs:
            assert outbox.append([OutboxMessage("t/big", b"x" * 20_000)]) == 1
        assert outbox.in_memory and set_aside.count == 0 and outbox.resets == 0
        assert outbox.stats()["taken_from_file"] == 6
        assert [e["taken_from_file"] for e in logs if e["event"] == "outbox_in_memory"] == [6]
        outbox.remove([m.id for m in in_flight])  # sent from the file, acknowledged now
        rest = outbox.peek_after(in_flight[-1].id, 10)
        assert [m.payload for m in rest] == [b"3", b"4", b"5", b"6", b"x" * 20_000]
        assert outbox.dropped_total == 2  # the file's 1 and the bound's 1 in memory
        outbox.remove([m.id for m in rest])
        now[0] = 10.0
        assert outbox.back_to_disk() and not outbox.in_memory and len(outbox) == 0
    with Outbox.open(path, max_messages=6) as reopened:
        assert reopened.peek(10) == [] and reopened.dropped_total == 2


def test_a_file_the_disk_refuses_to_open_is_read_into_memory(tmp_path: Path) -> None:
    """A start on a disk that refuses the file (here its ``-shm`` cannot be created) reads the
    messages the file holds into the memory queue, ahead of the new ones; they stay in the file
    until the drained queue moves back to it, so a restart before that sends them again."""
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=4) as outbox:
        outbox.append([message(n) for n in range(6)])  # 2 dropped at the bound
    shm = tmp_path / "o.sqlite3-shm"
    shm.symlink_to(tmp_path / "missing" / "shm")  # SQLITE_CANTOPEN, as a full disk gives
    now = [0.0]
    with Outbox.open(path, max_messages=4, memory_fallback=True, clock=lambda: now[0]) as outbox:
        assert outbox.in_memory and outbox.stats()["taken_from_file"] == 4
        outbox.append([message(6)])
        queued = outbox.peek(10)
        assert [m.payload for m in queued] == [b"3", b"4", b"5", b"6"]
        assert outbox.dropped_total == 3
    with Outbox.open(path, max_messages=4, memory_fallback=True, clock=lambda: now[0]) as outbox:
        assert [m.payload for m in outbox.peek(10)] == [b"2", b"3", b"4", b"5"]  # kept
        outbox.remove([m.id for m in outbox.peek(10)])
        shm.unlink()  # the disk takes the file again
        now[0] = 10.0
        assert outbox.back_to_disk()
    with Outbox.open(path, max_messages=4) as reopened:
        assert reopened.peek(10) == [] and reopened.dropped_total == 2


def test_without_memory_fallback_a_refusing_disk_is_an_error(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("x")
    with pytest.raises(OutboxError, match="cannot open outbox"):
        Outbox.open(blocker / "o.sqlite3", max_messages=3)


# -- the in-memory copy of a short queue answers exactly as the file does -------------------------

# (kind, a count or an id, a limit, picks among the queued messages)
_operations = st.lists(
    st.tuples(
        st.sampled_from(["append", "ack_oldest", "ack_some", "peek"]),
        st.integers(0, 60),
        st.integers(1, 30),
        st.lists(st.integers(0, 60), max_size=8),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(_operations, st.integers(1, 80), st.integers(1, 64))
def test_the_mirrored_queue_answers_as_the_file_does(
    operations: list[tuple[str, int, int, list[int]]], bound: int, capacity: int
) -> None:
    """Appends (over the bound too), acknowledgements of the oldest and of any ids, peeks after
    any id: a queue read from memory (small capacity: it also overflows and restarts) gives the
    same messages, lengths and drops as one always read from its file."""
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        mirrored = Outbox.open(root / "m.sqlite3", max_messages=bound, mirror_capacity=capacity)
        plain = Outbox.open(root / "p.sqlite3", max_messages=bound, mirror_capacity=0)
        serial = 0
        with mirrored, plain:
            for kind, number, limit, picks in operations:
                if kind == "append":
                    batch = [message(serial + n) for n in range(number + 1)]
                    serial += len(batch)
                    assert mirrored.append(batch) == plain.append(batch)
                elif kind in {"ack_oldest", "ack_some"}:
                    known = [m.id for m in plain.peek(1000)]
                    ids = (
                        known[:number]
                        if kind == "ack_oldest"
                        else sorted({known[i] for i in picks if i < len(known)})
                    )
                    mirrored.remove(ids)
                    plain.remove(ids)
                else:
                    assert mirrored.peek_after(number, limit) == plain.peek_after(number, limit)
                assert len(mirrored) == len(plain)
                assert mirrored.peek(1000) == plain.peek(1000)
                assert mirrored.dropped_total == plain.dropped_total


def test_corruption_under_a_mirrored_queue_is_met_at_the_next_write(tmp_path: Path) -> None:
    """The file damaged behind a short queue read from memory: the next write finds it, sets it
    aside and starts a fresh queue whose ids continue; nothing raises."""
    path = tmp_path / "o.sqlite3"
    set_aside = SetAsideLog()
    with Outbox.open(path, max_messages=1000, set_aside=set_aside) as outbox:
        outbox.append([message(n) for n in range(100)])
        in_flight = outbox.peek_after(0, 10)
        damage_the_queue_page(path)
        outbox.remove([m.id for m in in_flight])  # meets the damage: set aside, fresh queue
        assert outbox.resets == 1 and set_aside.count == 1
        outbox.append([message(200)])
        (new,) = outbox.peek(10)
        assert new.id > 100 and len(outbox) == 1


# -- what the queue reports and keeps (survivors of make mutation) ------------------------------


def aside_records(log: SetAsideLog) -> list[dict[str, Any]]:
    files = log.as_dict()["files"]
    assert isinstance(files, list)
    return files


def deny_selects(outbox: Outbox, table: str = "outbox") -> None:
    """SQLite refuses every SELECT that reads the queue's table from now on (SQLITE_AUTH, a real
    error of SQLite's own authorizer): proves what is answered from memory, and gives reads that
    fail as a disk that refuses them does. Writes still work."""
    selecting = [False]

    def authorizer(action: int, read: str | None, *_: object) -> int:
        if action in {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_DELETE, sqlite3.SQLITE_UPDATE}:
            selecting[0] = False
        elif action == sqlite3.SQLITE_SELECT:
            selecting[0] = True
        elif action == sqlite3.SQLITE_READ and read == table and selecting[0]:
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    outbox._storage.db.set_authorizer(authorizer)


def test_stats_name_every_field_on_disk_and_in_memory(tmp_path: Path) -> None:
    with Outbox.open(tmp_path / "o.sqlite3", max_messages=10) as outbox:
        assert outbox.stats() == {
            "storage": "disk",
            "disk_error": None,
            "memory_periods": 0,
            "memory_messages": 0,
            "taken_from_file": 0,
            "invalid_rows_dropped": 0,
            "resets": 0,
            "read_failures": 0,
        }
        assert not outbox.back_to_disk()  # on disk: nothing to move
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")
    path = blocker / "o.sqlite3"
    with Outbox.open(path, max_messages=10, memory_fallback=True) as outbox:
        outbox.append([message(1)])
        outbox.append([message(2), message(3)])
        assert outbox.stats() == {
            "storage": "memory",
            "disk_error": f"cannot open outbox {path}: FileExistsError: [Errno 17] File exists: "
            f"'{blocker}'",
            "memory_periods": 1,
            "memory_messages": 3,
            "taken_from_file": 0,
            "invalid_rows_dropped": 0,
            "resets": 0,
            "read_failures": 0,
        }


def test_a_short_queue_is_answered_without_reading_the_file(tmp_path: Path) -> None:
    """Appends to an empty queue are mirrored in memory (up to its capacity): peeks and the
    length then read nothing from the file, through removals and appends up to the capacity."""
    with Outbox.open(tmp_path / "o.sqlite3", max_messages=100, mirror_capacity=4) as outbox:
        outbox.append([message(n) for n in range(3)])
        deny_selects(outbox)
        first = outbox.peek(1)
        outbox.remove([first[0].id])
        outbox.remove([outbox.peek(1)[0].id])
        outbox.append([message(n) for n in range(3, 6)])  # 4 queued: the capacity
        assert [m.payload for m in outbox.peek(10)] == [b"2", b"3", b"4", b"5"]
        assert len(outbox) == 4
        assert outbox.read_failures == 0
    with Outbox.open(tmp_path / "p.sqlite3", max_messages=100, mirror_capacity=0) as outbox:
        outbox.append([message(0)])
        deny_selects(outbox)  # no mirror: the peek reads the file, and is refused
        assert outbox.peek(1) == []
        assert outbox.read_failures == 1


def test_reads_the_disk_refuses_are_counted_logged_and_answered_from_what_was_known(
    tmp_path: Path,
) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=100) as earlier:
        earlier.append([message(n) for n in range(4)])
    with Outbox.open(path, max_messages=100) as outbox:  # reopened: read from the file
        deny_selects(outbox)
        with capture_logs() as logs:
            assert len(outbox) == 0  # nothing known yet
            assert outbox.peek_after(0, 2) == []
        assert [(e["event"], e["what"], e["path"]) for e in logs] == [
            ("outbox_read_failed", what, str(path)) for what in ("count", "peek")
        ]
        assert all(e["error"].startswith("SQLITE_AUTH: ") for e in logs)
        assert outbox.read_failures == 2 and outbox.resets == 0
        outbox._storage.db.set_authorizer(None)
        assert len(outbox) == 4
        assert [m.payload for m in outbox.peek_after(0, 2)] == [b"0", b"1"]


def test_a_peek_from_the_file_returns_exactly_the_limit_past_invalid_rows(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=100) as outbox:
        outbox.append([message(n) for n in range(2)])
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO outbox (topic, payload, qos, retain, queued_at) "
            "VALUES ('t/#', x'00', 1, 0, 0)"
        )
    with Outbox.open(path, max_messages=100) as outbox:
        outbox.append([message(n) for n in range(2, 6)])
        with capture_logs() as logs:
            assert [m.payload for m in outbox.peek_after(0, 3)] == [b"0", b"1", b"2"]
        assert logs == [
            {
                "event": "outbox_invalid_row_dropped",
                "log_level": "error",
                "path": str(path),
                "id": 3,
            }
        ]
        assert len(outbox) == 6  # 7 rows, the invalid one deleted


def test_invalid_rows_that_cannot_be_deleted_are_skipped_and_deleted_later(
    tmp_path: Path,
) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=100) as outbox:
        outbox.append([message(1)])
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO outbox (topic, payload, qos, retain, queued_at) VALUES ('t/x', 5, 1, 0, 0)"
        )
    with Outbox.open(path, max_messages=100) as outbox:
        assert len(outbox) == 2

        def refuse_deletes(action: int, *_: object) -> int:
            return sqlite3.SQLITE_DENY if action == sqlite3.SQLITE_DELETE else sqlite3.SQLITE_OK

        outbox._storage.db.set_authorizer(refuse_deletes)
        with capture_logs() as logs:
            assert [m.payload for m in outbox.peek(10)] == [b"1"]
        failed = [e for e in logs if e["event"] == "outbox_invalid_row_delete_failed"]
        assert [(e["path"], e["error"].startswith("cannot write to outbox")) for e in failed] == [
            (str(path), True)
        ]
        assert len(outbox) == 1  # the invalid row no longer counts
        outbox._storage.db.set_authorizer(None)
        outbox.remove([])  # deleted now
        assert len(outbox) == 1 and outbox.invalid_rows_dropped == 1


def test_removal_deletes_exactly_the_ids_given(tmp_path: Path) -> None:
    with Outbox.open(tmp_path / "o.sqlite3", max_messages=5000, mirror_capacity=0) as outbox:
        assert outbox.append([]) == 0
        outbox.append([message(n) for n in range(3)])
        ids = [m.id for m in outbox.peek(3)]
        outbox.remove([ids[0], ids[0], ids[2]])  # a duplicate acknowledgement
        assert [m.payload for m in outbox.peek(10)] == [b"1"]
        outbox.remove([ids[1]])
        assert len(outbox) == 0
        outbox.append([message(n) for n in range(2400)])
        queued = [m.id for m in outbox.peek(2400)]
        outbox.remove(queued[:2200:2])  # 1100 ids, not consecutive: three statements
        assert len(outbox) == 1300
        assert [m.id for m in outbox.peek(3)] == [queued[1], queued[3], queued[5]]


def test_the_first_peek_after_opening_continues_after_the_id_given(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=100) as outbox:
        outbox.append([message(n) for n in range(3)])
        first = outbox.peek(1)[0].id
    with Outbox.open(path, max_messages=100) as outbox:
        assert [m.payload for m in outbox.peek_after(first, 10)] == [b"1", b"2"]


def test_a_reset_records_where_the_damage_was_met_and_ids_continue(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    set_aside = SetAsideLog()
    with Outbox.open(path, max_messages=1000, set_aside=set_aside, mirror_capacity=0) as outbox:
        outbox.append([message(0)])
        (only,) = outbox.peek(1)  # id 1 handed out
        damage_the_queue_page(path)
        outbox.append([message(1)])  # meets the damage: set aside, fresh queue, written again
        (new,) = outbox.peek(10)
        assert new.id > only.id and new.payload == b"1"
        damage_the_queue_page(path)
        outbox.remove([new.id])
        assert outbox.resets == 2 and outbox.stats()["resets"] == 2
    reasons = [record["reason"] for record in aside_records(set_aside)]
    assert [reason.split(":")[0] for reason in reasons] == ["append", "remove"]
    assert all("SQLITE_CORRUPT" in reason for reason in reasons)
    kinds = {record["kind"] for record in aside_records(set_aside)}
    assert kinds == {"outbox"}


def test_a_corrupt_file_at_open_is_set_aside_and_a_fresh_one_made(tmp_path: Path) -> None:
    path = tmp_path / "deeper" / "state" / "o.sqlite3"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"this is not a database" * 100)
    set_aside = SetAsideLog()
    with Outbox.open(path, max_messages=10, set_aside=set_aside) as outbox:
        outbox.append([message(1)])
    (record,) = aside_records(set_aside)
    assert record["kind"] == "outbox"
    assert record["reason"] == "open: SQLITE_NOTADB: file is not a database"
    with Outbox.open(tmp_path / "new" / "dirs" / "p.sqlite3", max_messages=10) as created:
        created.append([message(1)])
        assert len(created) == 1


def test_without_memory_fallback_a_refused_write_is_an_error(tmp_path: Path) -> None:
    with Outbox.open(tmp_path / "o.sqlite3", max_messages=100) as outbox:
        outbox.append([message(0)])
        refuse_writes(outbox)
        with pytest.raises(OutboxError, match="cannot write to outbox"):
            outbox.append([OutboxMessage("t/big", b"x" * 20_000)])
        assert not outbox.in_memory


def test_a_refused_write_moves_to_memory_and_says_why(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=100, memory_fallback=True, clock=lambda: now[0]) as outbox:
        outbox.append([message(0)])
        refuse_writes(outbox)
        with capture_logs() as logs:
            outbox.append([OutboxMessage("t/big", b"x" * 20_000)])
            outbox.append([message(2)])
        assert outbox.stats()["disk_error"] == (
            "cannot write to outbox: SQLITE_FULL: database or disk is full"
        )
        assert outbox.stats()["memory_messages"] == 2
        assert [e for e in logs if e["event"] == "outbox_in_memory"] == [
            {
                "event": "outbox_in_memory",
                "log_level": "error",
                "path": str(path),
                "error": "cannot write to outbox: SQLITE_FULL: database or disk is full",
                "taken_from_file": 1,
            }
        ]
        outbox.remove([m.id for m in outbox.peek(10)])
        now[0] = 4.9
        assert not outbox.back_to_disk()  # tried at most every 5 s
        now[0] = 5.0
        with capture_logs() as logs:
            assert outbox.back_to_disk()
        assert logs == [{"event": "outbox_on_disk_again", "log_level": "info", "path": str(path)}]
        now[0] = 20.0
        with capture_logs() as logs:
            assert not outbox.back_to_disk()  # on disk: nothing to do
        assert logs == []


def test_a_memory_queue_retries_the_disk_every_5_s_and_keeps_the_newest_error(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")
    path = blocker / "o.sqlite3"
    now = [0.0]
    with Outbox.open(path, max_messages=3, memory_fallback=True, clock=lambda: now[0]) as outbox:
        outbox.append([message(1)])
        now[0] = 6.0
        assert not outbox.back_to_disk()  # holds a message: waits for it
        outbox.remove([m.id for m in outbox.peek(10)])
        blocker.unlink()
        blocker.mkdir()
        (blocker / "o.sqlite3").mkdir()  # the disk answers differently now: still refused
        assert not outbox.back_to_disk()
        assert str(outbox.stats()["disk_error"]).startswith(f"cannot open outbox {path}")
        (blocker / "o.sqlite3").rmdir()
        now[0] = 10.0
        assert not outbox.back_to_disk()  # tried at 6: next at 11
        now[0] = 11.0
        assert outbox.back_to_disk()


def test_closing_a_memory_queue_logs_what_only_memory_held(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("x")
    path = blocker / "o.sqlite3"
    with capture_logs() as logs, Outbox.open(path, max_messages=10, memory_fallback=True) as outbox:
        outbox.append([message(n) for n in range(3)])
    lost = [e for e in logs if e["event"] == "outbox_memory_messages_lost"]
    assert lost == [
        {
            "event": "outbox_memory_messages_lost",
            "log_level": "warning",
            "path": str(path),
            "messages": 3,
            "why": outbox.stats()["disk_error"],
        }
    ]


def make_shm_unopenable(path: Path) -> Path:
    shm = path.with_name(path.name + "-shm")
    shm.symlink_to(path.parent / "missing" / "shm")  # SQLITE_CANTOPEN, as a full disk gives
    return shm


def test_a_file_without_drops_taken_over_counts_only_the_memory_queues(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=10) as outbox:
        outbox.append([message(n) for n in range(2)])
    shm = make_shm_unopenable(path)
    now = [0.0]
    with Outbox.open(path, max_messages=3, memory_fallback=True, clock=lambda: now[0]) as outbox:
        assert outbox.stats()["taken_from_file"] == 2
        outbox.append([message(n) for n in range(2, 5)])  # 2 dropped at the bound
        assert outbox.dropped_total == 2
        outbox.remove([m.id for m in outbox.peek(10)])
        shm.unlink()
        now[0] = 5.0
        assert outbox.back_to_disk()
        assert outbox.dropped_total == 2


def test_a_file_that_cannot_be_taken_over_is_left_for_later(tmp_path: Path) -> None:
    """A file the disk refuses whose messages cannot be read (here: its counters table is
    gone): the memory queue starts empty, the file keeps its messages, and none is lost."""
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=10) as outbox:
        outbox.append([message(n) for n in range(2)])
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("DROP TABLE counters")
    shm = make_shm_unopenable(path)
    now = [0.0]
    with (
        capture_logs() as logs,
        Outbox.open(path, max_messages=10, memory_fallback=True, clock=lambda: now[0]) as outbox,
    ):
        assert outbox.in_memory and outbox.peek(10) == []
        assert outbox.stats()["taken_from_file"] == 0
        shm.unlink()
        now[0] = 5.0
        assert outbox.back_to_disk()
        assert [m.payload for m in outbox.peek(10)] == [b"0", b"1"]
    unreadable = [e for e in logs if e["event"] == "outbox_file_unreadable"]
    assert unreadable == [
        {
            "event": "outbox_file_unreadable",
            "log_level": "error",
            "path": str(path),
            "error": "SQLITE_ERROR: no such table: file.counters",
        }
    ]


def test_a_missing_file_is_not_called_unreadable(tmp_path: Path) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("x")
    with (
        capture_logs() as logs,
        Outbox.open(blocker / "o.sqlite3", max_messages=3, memory_fallback=True),
    ):
        pass
    assert "outbox_file_unreadable" not in [e["event"] for e in logs]


def test_a_file_corrupt_when_the_queue_moves_back_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=10) as outbox:
        outbox.append([message(0)])
    shm = make_shm_unopenable(path)
    now = [0.0]
    set_aside = SetAsideLog()
    with Outbox.open(
        path, max_messages=10, set_aside=set_aside, memory_fallback=True, clock=lambda: now[0]
    ) as outbox:
        outbox.remove([m.id for m in outbox.peek(10)])
        shm.unlink()
        path.write_bytes(b"this is not a database" * 100)
        now[0] = 5.0
        assert outbox.back_to_disk()
        assert set_aside.count == 1 and len(outbox) == 0


def test_a_hand_back_the_file_refuses_keeps_the_queue_in_memory(tmp_path: Path) -> None:
    """Whatever makes the move back fail (here a trigger refusing the file's counter), the
    queue stays in memory and says why."""
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=10) as outbox:
        outbox.append([message(0)])
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON counters BEGIN SELECT RAISE(FAIL, 'no'); END"
        )
    shm = make_shm_unopenable(path)
    now = [0.0]
    with Outbox.open(path, max_messages=10, memory_fallback=True, clock=lambda: now[0]) as outbox:
        outbox.remove([m.id for m in outbox.peek(10)])
        shm.unlink()
        now[0] = 5.0
        assert not outbox.back_to_disk()
        assert outbox.in_memory
        assert outbox.stats()["disk_error"] == (
            f"cannot write to outbox {path}: SQLITE_CONSTRAINT_TRIGGER: no"
        )


def test_the_queue_is_used_from_one_thread_only(tmp_path: Path) -> None:
    with Outbox.open(tmp_path / "o.sqlite3", max_messages=10, mirror_capacity=0) as outbox:
        outbox.append([message(0)])
        with ThreadPoolExecutor(1) as pool, pytest.raises(sqlite3.ProgrammingError):
            pool.submit(outbox.peek, 1).result()


def test_a_refused_read_of_the_drop_count_answers_the_last_known(tmp_path: Path) -> None:
    with Outbox.open(tmp_path / "o.sqlite3", max_messages=2) as outbox:
        deny_selects(outbox, "counters")
        with capture_logs() as logs:
            assert outbox.dropped_total == 0  # nothing known yet
        assert [(e["event"], e["what"]) for e in logs] == [("outbox_read_failed", "dropped_total")]
        outbox._storage.db.set_authorizer(None)
        outbox.append([message(n) for n in range(3)])
        assert outbox.dropped_total == 1
        deny_selects(outbox, "counters")
        assert outbox.dropped_total == 1 and outbox.read_failures == 2


def test_a_corrupt_queue_met_by_a_count_answers_for_the_fresh_one(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    set_aside = SetAsideLog()
    with Outbox.open(path, max_messages=1000) as earlier:
        earlier.append([message(n) for n in range(100)])
    with Outbox.open(path, max_messages=1000, set_aside=set_aside) as outbox:
        assert len(outbox) == 100
        outbox.peek(5)
        outbox._count = None  # (as after any write the table might not match)
        damage_the_queue_page(path)
        assert len(outbox) == 0  # the fresh queue's, not the 100 last known
        (record,) = aside_records(set_aside)
        assert record["reason"].startswith("count: SQLITE_CORRUPT")


def test_after_moving_back_to_the_file_only_the_first_peek_starts_at_the_front(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("x")
    now = [0.0]
    with Outbox.open(
        blocker / "o.sqlite3", max_messages=10, memory_fallback=True, clock=lambda: now[0]
    ) as outbox:
        outbox.append([message(0)])
        sent = outbox.peek_after(0, 10)
        outbox.remove([m.id for m in sent])
        blocker.unlink()
        now[0] = 5.0
        outbox.append([message(n) for n in range(1, 4)])  # moves back first: ids start low
        (first,) = outbox.peek_after(sent[-1].id, 1)  # below the memory ids: from the front
        assert first.payload == b"1"
        assert [m.payload for m in outbox.peek_after(first.id, 10)] == [b"2", b"3"]


def test_a_corrupt_file_that_cannot_be_made_again_moves_the_queue_to_memory(
    tmp_path: Path,
) -> None:
    """Damage met at a read, and the fresh file refused by the disk (a real EFBIG from the
    process's file-size limit): the queue goes on, empty, in memory, with nothing to take over
    (no false alarm about the file); what it drops there reaches the file when the disk is
    back."""
    path = tmp_path / "o.sqlite3"
    now = [0.0]
    with Outbox.open(path, max_messages=100) as earlier:
        earlier.append([message(n) for n in range(50)])
    with Outbox.open(
        path, max_messages=100, memory_fallback=True, mirror_capacity=0, clock=lambda: now[0]
    ) as outbox:
        handed_out = outbox.peek(5)
        damage_the_queue_page(path)
        previous_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
        try:
            with capture_logs() as logs:
                assert outbox.peek_after(handed_out[-1].id, 10) == []
        finally:
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            signal.signal(signal.SIGXFSZ, previous_handler)
        (moved,) = [e for e in logs if e["event"] == "outbox_in_memory"]
        assert moved["taken_from_file"] == 0
        assert str(moved["error"]).startswith(f"cannot open outbox {path}")
        assert outbox.stats()["storage"] == "memory" and outbox.stats()["memory_periods"] == 1
        assert outbox.resets == 1
        assert not [e for e in logs if e["event"] == "outbox_file_unreadable"]
        outbox.append([message(99)])
        (new,) = outbox.peek(10)
        assert new.payload == b"99" and new.id > handed_out[-1].id
        outbox.append([message(n) for n in range(101)])  # over the bound: 2 dropped
        outbox.remove([m.id for m in outbox.peek(100)])
        now[0] = 5.0
        assert outbox.back_to_disk() and outbox.dropped_total == 2
    with Outbox.open(path, max_messages=100) as reopened:
        assert reopened.peek(10) == [] and reopened.dropped_total == 2


def test_every_period_in_memory_is_counted_with_what_it_took_over(tmp_path: Path) -> None:
    now = [0.0]
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=100, memory_fallback=True, clock=lambda: now[0]) as outbox:
        for period, count in enumerate((2, 3)):
            outbox.append([message(n) for n in range(count)])
            refuse_writes(outbox)
            outbox.append([OutboxMessage("t/big", b"x" * 20_000)])
            assert outbox.in_memory
            outbox.remove([m.id for m in outbox.peek(10)])
            now[0] += 5.0
            assert outbox.back_to_disk(), period
        assert outbox.stats()["taken_from_file"] == 5
        assert outbox.stats()["memory_periods"] == 2


def test_a_file_locked_by_another_process_is_taken_over_without_locks(tmp_path: Path) -> None:
    """Another process holds the file exclusively (a rollback-journal file: no -wal): opening
    it is refused (SQLITE_BUSY), and its messages are read without locks into memory."""
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=10) as earlier:
        earlier.append([message(n) for n in range(2)])
    holder = sqlite3.connect(path, isolation_level=None)
    try:
        holder.execute("PRAGMA journal_mode=DELETE")
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        with Outbox.open(path, max_messages=10, memory_fallback=True) as outbox:
            assert outbox.in_memory and outbox.stats()["taken_from_file"] == 2
            assert [m.payload for m in outbox.peek(10)] == [b"0", b"1"]
    finally:
        holder.close()


def test_messages_dropped_in_memory_after_a_failed_take_over_reach_the_file(
    tmp_path: Path,
) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=10) as outbox:
        outbox.append([message(0)])
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("DROP TABLE counters")  # the take-over cannot read the file
    shm = make_shm_unopenable(path)
    now = [0.0]
    with Outbox.open(path, max_messages=2, memory_fallback=True, clock=lambda: now[0]) as outbox:
        outbox.append([message(n) for n in range(1, 4)])  # one dropped at the bound
        outbox.remove([m.id for m in outbox.peek(10)])
        shm.unlink()
        now[0] = 5.0
        assert outbox.back_to_disk()
        assert outbox.dropped_total == 1


@pytest.mark.parametrize(
    ("values", "kept"),
    [
        ("CAST('t/blob' AS BLOB), x'00', 1, 0", False),  # a topic stored as a blob
        ("'t/x' || char(0), x'00', 1, 0", False),
        ("'', x'00', 1, 0", False),
        ("'t/+', x'00', 1, 0", False),
        ("'t/x', x'00', 3, 0", False),
        ("'t/x', x'00', 0, 0", True),
        ("'t/x', x'00', 2, 1", True),
    ],
)
def test_only_rows_that_are_messages_are_returned(tmp_path: Path, values: str, kept: bool) -> None:
    path = tmp_path / "o.sqlite3"
    with Outbox.open(path, max_messages=10) as outbox:
        outbox.append([message(1)])
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            f"INSERT INTO outbox (topic, payload, qos, retain, queued_at) VALUES ({values}, 0)"
        )
    with Outbox.open(path, max_messages=10) as outbox:
        peeked = outbox.peek(10)
        assert len(peeked) == (2 if kept else 1)
        assert outbox.invalid_rows_dropped == (0 if kept else 1)


def test_the_longest_topic_mqtt_allows_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "o.sqlite3"
    longest = "t/" + "x" * 65_533
    with Outbox.open(path, max_messages=10) as outbox:
        outbox.append([OutboxMessage(longest, b"1"), OutboxMessage(longest + "y", b"2")])
    with Outbox.open(path, max_messages=10) as outbox:
        assert [m.topic for m in outbox.peek(10)] == [longest]

"""Reading's hand-written ``__init__`` (contract/readings.py) keeps the frozen dataclass's
behaviour: its signature, each field set from its own argument, equality, hashing, ``replace``,
copies and pickles, immutability."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import pickle

import pytest

from tesla_gateway.contract.readings import Reading, covariate_fault

DROPPED = (covariate_fault("rh", "out of range"),)


def every_field_set() -> Reading:
    """A reading whose every field differs from its default and from the others."""
    return Reading("node-1", 1_700_000_000.5, {"pm10": 12.5}, "mqtt", 7, DROPPED, True)


def test_init_has_the_dataclass_signature() -> None:
    """Parameters in field order, each field's default (a field added or moved fails here)."""
    parameters = list(inspect.signature(Reading.__init__).parameters.values())[1:]
    fields = dataclasses.fields(Reading)
    assert [p.name for p in parameters] == [f.name for f in fields]
    for parameter, field in zip(parameters, fields, strict=True):
        assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        want = inspect.Parameter.empty if field.default is dataclasses.MISSING else field.default
        assert parameter.default == want, field.name


def test_each_field_holds_its_own_argument_positional_or_by_keyword() -> None:
    by_position = every_field_set()
    by_keyword = Reading(
        stamped_at_gateway=True,
        dropped=DROPPED,
        seq=7,
        source="mqtt",
        values={"pm10": 12.5},
        timestamp=1_700_000_000.5,
        sensor_id="node-1",
    )
    for reading in (by_position, by_keyword):
        assert reading.sensor_id == "node-1"
        assert reading.timestamp == 1_700_000_000.5
        assert reading.values == {"pm10": 12.5}
        assert reading.source == "mqtt"
        assert reading.seq == 7
        assert reading.dropped is DROPPED
        assert reading.stamped_at_gateway is True
    defaults = Reading("node-1", 1.0, {"pm10": 1.0})
    assert (defaults.source, defaults.seq, defaults.dropped, defaults.stamped_at_gateway) == (
        "unknown",
        None,
        (),
        False,
    )


def test_equality_and_hash_follow_the_compared_fields() -> None:
    reading = every_field_set()
    # dropped and stamped_at_gateway are not compared: the same measurement either way
    plain = Reading("node-1", 1_700_000_000.5, {"pm10": 12.5}, "mqtt", 7)
    assert reading == plain and hash(reading) == hash(plain)
    for changed in (
        dataclasses.replace(reading, sensor_id="node-2"),
        dataclasses.replace(reading, timestamp=1.0),
        dataclasses.replace(reading, values={"pm10": 1.0}),
        dataclasses.replace(reading, source="serial"),
        dataclasses.replace(reading, seq=8),
    ):
        assert changed != reading
    assert len({reading, plain, dataclasses.replace(reading, seq=8)}) == 2


def test_replace_copy_and_pickle_keep_every_field() -> None:
    reading = every_field_set()
    moved = dataclasses.replace(reading, timestamp=5.0)
    assert (moved.timestamp, moved.sensor_id, moved.seq, moved.dropped) == (
        5.0,
        "node-1",
        7,
        DROPPED,
    )
    assert moved.stamped_at_gateway is True
    assert copy.copy(reading).dropped is DROPPED
    # Nothing dropped and values a dict: a ReadingRejectedError neither pickles nor
    # deep-copies, nor does the mappingproxy the decoders wrap values in (nothing pickles one).
    plain = dataclasses.replace(reading, dropped=())
    for twin in (copy.copy(plain), copy.deepcopy(plain), pickle.loads(pickle.dumps(plain))):
        assert twin == plain
        assert (twin.source, twin.seq, twin.stamped_at_gateway) == ("mqtt", 7, True)


def test_a_reading_is_immutable() -> None:
    reading = every_field_set()
    with pytest.raises(dataclasses.FrozenInstanceError):
        reading.seq = 8  # type: ignore[misc]

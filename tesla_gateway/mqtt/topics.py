"""Topic strings that check themselves when made, so a bad topic fails at config load.

Both are ``str`` subclasses: once built they are used as plain strings, and pydantic fields typed
with them validate (and report) like any other field.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import GetCoreSchemaHandler
from pydantic_core import core_schema

__all__ = ["PublishTopic", "TopicFilter"]


class _CheckedTopic(str):
    """A topic string validated by ``_problem`` on construction."""

    __slots__ = ()

    def __new__(cls, value: str) -> Self:
        problem = cls._problem(value)
        if problem is not None:
            raise ValueError(f"{value!r} {problem}")
        return super().__new__(cls, value)

    @classmethod
    def _problem(cls, value: str) -> str | None:
        raise NotImplementedError

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(),
            serialization=core_schema.plain_serializer_function_ser_schema(str),
        )


class PublishTopic(_CheckedTopic):
    """A topic (or prefix) to publish on: no wildcards, no empty, leading or trailing level."""

    __slots__ = ()

    @classmethod
    def _problem(cls, value: str) -> str | None:
        if (
            not value
            or "+" in value
            or "#" in value
            or value.startswith("/")
            or value.endswith("/")
            or "//" in value
        ):
            return "must be a topic without wildcards or empty/leading/trailing levels"
        return None


class TopicFilter(_CheckedTopic):
    """A subscription filter: ``+`` only as a whole level, ``#`` only as the whole last level."""

    __slots__ = ()

    @classmethod
    def _problem(cls, value: str) -> str | None:
        levels = value.split("/")
        if not value or any(
            ("#" in level and (level != "#" or index != len(levels) - 1))
            or ("+" in level and level != "+")
            for index, level in enumerate(levels)
        ):
            return "is not a valid MQTT topic filter"
        return None

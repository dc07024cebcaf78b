"""Where in the TOML file a validation error is: ``sources[0].broker.port``, not pydantic's
``sources.0.mqtt.broker.port``.

pydantic's location names list items by number and puts a discriminated union's tag (``mqtt``
for a ``kind = "mqtt"`` source) among the keys, so it is neither what the operator typed nor
what an environment override is named. :func:`locate` walks the configuration's models along
the location instead, drops the tags and knows, at the end, which keys the table there allows:
the words an unknown key is compared with for a "did you mean".
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

__all__ = ["Location", "locate"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


@dataclass(frozen=True, slots=True)
class Location:
    """One error's place in the file."""

    path: str  # as TOML writes it: sources[0].broker.port ('' for the whole file)
    dotted: str  # the environment override's form: sources.0.broker.port
    allowed: tuple[str, ...]  # the keys the table holding the last key allows (sorted)


def locate(root: type[BaseModel], loc: Sequence[int | str]) -> Location:
    """The TOML path of ``loc`` under ``root``, without union tags, and the keys allowed where
    its last key is (empty when that place is not a known table)."""
    parts: list[int | str] = []
    node: object = root
    allowed: tuple[str, ...] = ()
    for part in loc:
        if isinstance(part, int):
            node = _item_type(node)
            parts.append(part)
            allowed = ()
            continue
        models = _models(node)
        if len(models) > 1:  # a discriminated union: this part is the tag, not a key
            key = _discriminator(node)
            chosen = next((m for m in models if _has_tag(m, key, part)), None)
            if chosen is not None:
                node = chosen
                continue
            models = []  # not a tag (the union's own "kind" key, say)
        parts.append(part)
        if models:
            allowed = tuple(sorted(models[0].model_fields))
            field = models[0].model_fields.get(part)
            node = field.annotation if field is not None else None
        else:
            allowed, node = (), None
    return Location(_toml_path(parts), ".".join(str(part) for part in parts), allowed)


def _toml_path(parts: Sequence[int | str]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            key = part if _BARE_KEY.fullmatch(part) else f'"{part}"'
            text += f".{key}" if text else key
    return text


def _members(node: object) -> list[object]:
    """``node`` without ``Annotated``, split into the members of its union (None left out)."""
    if typing.get_origin(node) is typing.Annotated:
        node = typing.get_args(node)[0]
    if typing.get_origin(node) in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(node) if arg is not type(None) for m in _members(arg)]
    return [node]


def _models(node: object) -> list[type[BaseModel]]:
    return [m for m in _members(node) if isinstance(m, type) and issubclass(m, BaseModel)]


def _item_type(node: object) -> object:
    """The item type of the list (or tuple) among ``node``'s members; None if there is none."""
    for member in _members(node):
        if typing.get_origin(member) in (list, tuple) and typing.get_args(member):
            return typing.get_args(member)[0]
    return None


def _discriminator(node: object) -> str | None:
    """The field that chooses a union's member (``Field(discriminator=...)``), if declared."""
    if typing.get_origin(node) is typing.Annotated:
        for meta in typing.get_args(node)[1:]:
            if isinstance(key := getattr(meta, "discriminator", None), str):
                return key
    return None


def _has_tag(model: type[BaseModel], key: str | None, tag: str) -> bool:
    """Whether ``model``'s discriminator field ``key`` (any ``Literal`` field when unknown)
    takes the value ``tag``."""
    for name, field in model.model_fields.items():
        if key not in (None, name) or typing.get_origin(field.annotation) is not typing.Literal:
            continue
        if tag in typing.get_args(field.annotation):
            return True
    return False

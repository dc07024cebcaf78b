"""Configuration errors that never echo a value: what was wrong and where, never what was given.

pydantic renders its errors with the input (``input_value='...'``), and a custom validator may
put the value in its message. A configuration error is printed to stderr and so lands in
journald, and the value at fault may be a password: under a misspelled key (``passwd``), under
a key that is not secret (a password pasted into ``port``) or from an environment variable. No
list of secret-looking names can foresee every such slip, so an error names the key and the
rule it broke and, of the input, only its type. The one exception keeps errors such as
``tick.grace_s = -1`` readable: a plain number given to a known key whose name does not look
secret is shown (a password is a string; a string is never shown).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterator, Sequence

from pydantic_core import ErrorDetails

__all__ = ["explain", "input_hint", "redacted_message", "tag_key"]

_MIN_REDACTED = 3  # shorter strings ("1", "no") are too likely to be part of pydantic's own text
_REDACTED = "<value hidden>"
_SECRET_WORDS = ("pass", "secret", "token", "private", "key", "pin")  # numbers hidden there too
# pydantic's error types for a missing value or one of the wrong type, in TOML's words.
_WORDS = {
    "missing": "missing (required)",
    "int_type": "expected an integer",
    "int_parsing": "expected an integer",
    "int_from_float": "expected an integer",
    "float_type": "expected a number",
    "float_parsing": "expected a number",
    "bool_type": "expected true or false",
    "bool_parsing": "expected true or false",
    "string_type": "expected a string",
    "list_type": "expected an array",
    "tuple_type": "expected an array",
    "dict_type": "expected a table",
    "model_type": "expected a table",
    "model_attributes_type": "expected a table",
    "path_type": "expected a path (a string)",
}
# Bounds, in words: pydantic's error type -> (sentence, the ctx key holding the limit).
_BOUNDS = {
    "greater_than_equal": ("must be at least {}", "ge"),
    "greater_than": ("must be greater than {}", "gt"),
    "less_than_equal": ("must be at most {}", "le"),
    "less_than": ("must be less than {}", "lt"),
    "too_short": ("needs at least {} item(s)", "min_length"),
    "too_long": ("takes at most {} item(s)", "max_length"),
    "string_too_short": ("needs at least {} character(s)", "min_length"),
    "string_too_long": ("takes at most {} character(s)", "max_length"),
    "string_pattern_mismatch": ("must match {}", "pattern"),
}
_QUOTED = re.compile(r"'([^']*)'")


def explain(error: ErrorDetails, allowed: Sequence[str]) -> str:
    """What is wrong, in the words of a TOML file: an unknown key with the closest of the keys
    ``allowed`` in its table, the type a value should have, a bound, the values allowed;
    pydantic's message (redacted) for the rest."""
    kind, ctx = error["type"], error.get("ctx") or {}
    if kind == "extra_forbidden":
        return _unknown_key(str(error["loc"][-1]) if error["loc"] else "", allowed)
    if kind in _WORDS:
        return _WORDS[kind]
    if kind in _BOUNDS and _BOUNDS[kind][1] in ctx:
        sentence, limit = _BOUNDS[kind]
        bound = ctx[limit]
        return sentence.format(
            int(bound) if isinstance(bound, float) and bound.is_integer() else bound
        )
    if kind in ("literal_error", "enum", "union_tag_invalid", "union_tag_not_found"):
        return _choice(error)
    return redacted_message(error).removeprefix("Value error, ")  # our validators' own words


def tag_key(error: ErrorDetails) -> str | None:
    """The key a union's tag is read from (``kind``) when the error is about it: the error's
    location names the table, the key is added to it."""
    if error["type"] not in ("union_tag_invalid", "union_tag_not_found"):
        return None
    return str((error.get("ctx") or {}).get("discriminator", "kind")).strip("'")


def _unknown_key(key: str, allowed: Sequence[str]) -> str:
    close = _closest(key, allowed)
    if close:
        return f"unknown key; did you mean {close!r}?"
    return f"unknown key (allowed here: {', '.join(allowed)})" if allowed else "unknown key"


def _choice(error: ErrorDetails) -> str:
    """A value outside a fixed set: a ``Literal`` or enum, or a union's tag (sources[0].kind)."""
    ctx = error.get("ctx") or {}
    if error["type"] == "union_tag_not_found":
        return "missing (required)"
    if error["type"] == "union_tag_invalid":
        return _one_of(ctx.get("tag"), str(ctx.get("expected_tags", "")))
    return _one_of(error.get("input"), str(ctx.get("expected", "")))


def _one_of(given: object, expected: str) -> str:
    """``expected one of 'a', 'b'`` with the closest of them when the value is text (an
    allowed value is suggested; the given one is never shown)."""
    choices = _QUOTED.findall(expected)
    close = _closest(given, choices) if isinstance(given, str) else None
    listed = ", ".join(repr(choice) for choice in choices) or expected
    return f"expected one of {listed}" + (f"; did you mean {close!r}?" if close else "")


def _closest(word: object, choices: Sequence[str]) -> str | None:
    """The allowed word closest to a mistyped one (case aside), if one is close enough."""
    if not isinstance(word, str) or not word:
        return None
    lowered = {choice.lower(): choice for choice in choices}
    match = difflib.get_close_matches(word.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[match[0]] if match else None


def input_hint(error: ErrorDetails) -> str:
    """What kind of value was given (`` (got a str)``); the value only if a harmless number."""
    if error["type"] in ("missing", "extra_forbidden", "union_tag_invalid"):
        return ""
    given = error.get("input")
    if given is None or isinstance(given, dict | list):
        return ""
    key = ".".join(str(part) for part in error["loc"]).lower()
    if (
        isinstance(given, int | float)
        and not isinstance(given, bool)
        and error["type"] != "extra_forbidden"  # an unknown key: a misspelled "passwd"?
        and not any(word in key for word in _SECRET_WORDS)
    ):
        return f" (got {given!r})"
    name = type(given).__name__
    return f" (got {'an' if name[0] in 'aeiou' else 'a'} {name})"


def redacted_message(error: ErrorDetails) -> str:
    """pydantic's message with every string of the input blanked out where it appears."""
    message = error["msg"]
    for text in sorted(set(_strings(error.get("input"))), key=len, reverse=True):
        if len(text) >= _MIN_REDACTED:
            message = message.replace(text, _REDACTED)
    return message


def _strings(value: object) -> Iterator[str]:
    """Every value inside an input (nested tables and arrays included) as text; keys are names
    the schema or the operator chose, not values, and stay readable."""
    if isinstance(value, str):
        yield value
        yield repr(value)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings(item)
    elif value is not None and not isinstance(value, bool):
        yield str(value)

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

from collections.abc import Iterator

from pydantic_core import ErrorDetails

__all__ = ["input_hint", "redacted_message"]

_MIN_REDACTED = 3  # shorter strings ("1", "no") are too likely to be part of pydantic's own text
_REDACTED = "<value hidden>"
_SECRET_WORDS = ("pass", "secret", "token", "private", "key", "pin")  # numbers hidden there too


def input_hint(error: ErrorDetails) -> str:
    """What kind of value was given (`` (got a str)``); the value only if a harmless number."""
    if error["type"] == "missing":
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
    return f" (got a {type(given).__name__})"


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

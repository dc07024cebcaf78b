"""argparse types shared by the training commands: a value is refused while the arguments are
parsed, before any training, conversion or verification has been spent on it."""

from __future__ import annotations

import argparse
import re

__all__ = ["model_name"]


def model_name(text: str) -> str:
    """``--name``: a name the manifest accepts (``MODEL_NAME_PATTERN``; it also names the model's
    directory, topics and log lines). Before, ``export --name 'a+b'`` converted and verified the
    whole model and then failed on the manifest's validation."""
    from tesla_gateway.contract.manifest import MODEL_NAME_PATTERN

    if re.fullmatch(MODEL_NAME_PATTERN, text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a model name: use lower-case letters, digits, '.', '_' and '-', "
            "starting with a letter or digit, at most 64 characters (e.g. pm10-ispra-1min)"
        )
    return text

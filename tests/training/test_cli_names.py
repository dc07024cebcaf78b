"""A model name the manifest would refuse is refused while the arguments are parsed.

Before, ``tesla-train export --name 'a+b'`` loaded the run, converted and verified the whole
model (tens of seconds to minutes) and then died on the manifest's pydantic traceback. Now the
name is checked against the manifest's own pattern (``MODEL_NAME_PATTERN``) by argparse: exit 2
at once, with what a name may hold, nothing written.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from tesla_gateway.contract.manifest import Manifest
from training.cli_types import model_name

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["export", "retrain"])
@pytest.mark.parametrize("name", ["a+b", "PM10", "-lead", "x" * 65, ""])
def test_a_bad_name_is_refused_before_any_work(tmp_path: Path, command: str, name: str) -> None:
    run = tmp_path / "run"
    run.mkdir()  # a run directory that exists (its contents are never looked at)
    out = tmp_path / "out"
    argv = {
        "export": ["export", "--run", str(run), "--out", str(out)],
        "retrain": ["retrain", "--champion", str(run), "--pairs", str(run), "--out", str(out)],
    }[command]
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "training", *argv, f"--name={name}"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"argument --name: {name!r} is not a model name" in result.stderr
    assert "lower-case letters, digits" in result.stderr
    assert "Traceback" not in result.stderr
    assert not out.exists()
    assert time.monotonic() - started < 60  # no conversion (it took minutes); loose: shared CPU


@given(st.text(max_size=70))
def test_the_argument_and_the_manifest_accept_the_same_names(text: str) -> None:
    try:
        model_name(text)
        accepted = True
    except argparse.ArgumentTypeError:
        accepted = False
    try:
        Manifest.model_validate({"name": text})
    except ValidationError as exc:
        manifest_accepts = not any(error["loc"] == ("name",) for error in exc.errors())
    assert accepted == manifest_accepts


def test_a_good_name_passes() -> None:
    assert model_name("pm10-ispra-1min") == "pm10-ispra-1min"

"""A configuration mistake is told in the file's own terms: the TOML path, "did you mean" for a
mistyped key, the type a value should have.

Before, ``check-config`` printed pydantic's location and words: ``sources.0.mqtt.broker.prot:
Extra inputs are not permitted (got a int)``, with the union's tag (``mqtt``) among the keys and
list items by number. The real CLI in a subprocess, as an operator runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]

BASE = """
gateway_id = "gw-typo"
state_dir = "{state}"
{top}
[[models]]
feature = "pm10"
model_dir = "{state}"
"""

SOURCE = '[[sources]]\nkind = "mqtt"\n'
REFERENCE = (
    '[[references]]\nname = "r"\nfeature = "pm10"\ncolocated_with = ["s1"]\n'
    '[references.mqtt]\ntopics = ["ref/r"]\n'
)

# (case, extra TOML (TOP: a top-level key, before the tables), the line check-config must print)
CASES = [
    (
        "nested key",
        SOURCE + "[sources.broker]\nprot = 1884\n",
        "sources[0].broker.prot: unknown key; did you mean 'port'?",
    ),
    ("top-level key", 'TOP stat_dir = "x"', "stat_dir: unknown key; did you mean 'state_dir'?"),
    ("case", "[tick]\nGrace_S = 3\n", "tick.Grace_S: unknown key; did you mean 'grace_s'?"),
    (
        "section",
        '[publisher.brokr]\nhost = "x"\n',
        "publisher.brokr: unknown key; did you mean 'broker'?",
    ),
    (
        "second list item",
        SOURCE + SOURCE + "[sources.broker]\nkeepalive = 60\nusrname = 'gw'\n",
        "sources[1].broker.usrname: unknown key; did you mean 'username'?",
    ),
    (
        "wrong type",
        '[publisher.broker]\nport = "eighteen"\n',
        "publisher.broker.port: expected an integer (got a str)",
    ),
    (
        "wrong type in a reference",
        REFERENCE + '[references.mqtt.broker]\nkeepalive = "sixty"\n',
        "references[0].mqtt.broker.keepalive: expected an integer (got a str)",
    ),
    ("table expected", 'TOP tick = "fast"', "tick: expected a table (got a str)"),
    ("array expected", SOURCE + 'topics = "a/+"\n', "sources[0].topics: expected an array"),
    (
        "source kind",
        '[[sources]]\nkind = "mqqt"\n',
        "sources[0].kind: expected one of 'mqtt', 'node', 'pms5003'",
    ),
    (
        "allowed value",
        '[logging]\nlevel = "warn"\n',
        "logging.level: expected one of 'debug', 'info', 'warning', 'error'; "
        "did you mean 'warning'?",
    ),
    ("bound", "[tick]\ngrace_s = -1\n", "tick.grace_s: must be at least 0 (got -1)"),
    ("missing", SOURCE.replace('kind = "mqtt"\n', ""), "sources[0].kind: missing (required)"),
]


@pytest.mark.parametrize(("extra", "line"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_check_config_names_the_toml_path_and_the_likely_key(
    tmp_path: Path, extra: str, line: str
) -> None:
    config = tmp_path / "gateway.toml"
    top, extra = (extra[4:], "") if extra.startswith("TOP ") else ("", extra)
    config.write_text(BASE.format(state=tmp_path, top=top) + extra, encoding="utf-8")
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("TESLA_GATEWAY__")}
    result = subprocess.run(
        [sys.executable, "-m", "tesla_gateway", "check-config", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**clean, "PYTHONPATH": str(REPO)},
        check=False,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"\n  {line}" in result.stderr, result.stderr
    for pydantic_words in ("Extra inputs", "Input should", "Field required", "sources.0"):
        assert pydantic_words not in result.stderr
    assert "Traceback" not in result.stderr
    assert "eighteen" not in result.stderr and "sixty" not in result.stderr  # never the value

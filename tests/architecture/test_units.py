"""One micro sign everywhere a person reads a unit: ``µg/m³`` with U+00B5 (MICRO SIGN).

Before, the gateway wrote ``µg/m³`` (U+00B5) in its payloads, logs and docs, ``ug/m3`` in some
error messages (a model refused as implausible, a golden-window mismatch) and ``μg/m³`` with the
Greek mu (U+03BC) where Home Assistant's unit is described. U+00B5 is what the payloads always
carried and what nearly every text here already used. U+03BC stays only where an external
specification demands it, each listed below with the reason; ``ug/m3`` only as the manifest's
ASCII unit identifier.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GREEK_MU = "\u03bc"


def _files() -> list[Path]:
    """Where a person reads units: the package, the training and dev tools, the docs and the
    example configuration (tests/ may say anything; docs/benchmarks' JSON files are data)."""
    found: list[Path] = []
    for folder in ("tesla_gateway", "training", "devkit"):
        found.extend(sorted((REPO / folder).rglob("*.py")))
    found.extend(sorted((REPO / "docs").rglob("*.md")))
    found.extend([REPO / "README.md", REPO / "deploy" / "gateway.example.toml"])
    return [path for path in found if "__pycache__" not in path.parts]


# The Greek mu where an external specification wants it: Home Assistant's unit constant
# (CONCENTRATION_MICROGRAMS_PER_CUBIC_METER, its linter enforces U+03BC) sent as
# unit_of_measurement in discovery, and Grafana's unit id "conμgm3"; the docs that show them.
GREEK_MU_ALLOWED = {
    "tesla_gateway/publish/discovery.py": ("\\u03bcg/m", "Greek mu (U+03BC)"),
    "docs/mqtt.md": ('"unit_of_measurement": "μg/m³"', "with the Greek mu"),
    "docs/deployment.md": ("conμgm3",),
}
# The manifest's ASCII unit identifier ("unit": "ug/m3"), and the code that writes or maps it.
ASCII_UNIT_ALLOWED = {
    "tesla_gateway/contract/manifest.py",
    "tesla_gateway/daemon/ticker.py",
    "tesla_gateway/publish/payloads.py",
    "training/model_dir.py",
    "training/firmware_constants.py",  # checks a manifest channel's unit before a node feeds it
}


def _offending_lines(text: str, needles: tuple[str, ...], allowed: tuple[str, ...]) -> list[str]:
    return [
        line.strip()
        for line in text.splitlines()
        if any(needle in line.lower() for needle in needles)
        and not any(fragment.lower() in line.lower() for fragment in allowed)
    ]


def test_the_greek_mu_only_where_an_external_spec_wants_it() -> None:
    found: dict[str, list[str]] = {}
    for path in _files():
        name = path.relative_to(REPO).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = _offending_lines(text, (GREEK_MU, "\\u03bc"), GREEK_MU_ALLOWED.get(name, ()))
        if lines:
            found[name] = lines
    assert not found, f"write µ (U+00B5, MICRO SIGN), not μ (U+03BC): {found}"


def test_ug_m3_only_as_the_manifests_unit_identifier() -> None:
    found: dict[str, list[str]] = {}
    for path in _files():
        name = path.relative_to(REPO).as_posix()
        if name in ASCII_UNIT_ALLOWED:
            continue
        lines = _offending_lines(path.read_text(encoding="utf-8"), ("ug/m3",), ())
        if lines:
            found[name] = lines
    assert not found, f"write µg/m³ where a person reads it: {found}"


def test_the_check_sees_a_greek_mu() -> None:
    assert _offending_lines("limit 5 μg/m³", (GREEK_MU,), ())
    assert not _offending_lines("limit 5 µg/m³", (GREEK_MU,), ())

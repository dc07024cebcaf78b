"""No committed manifest names a folder of the machine that built it (issue 27 part 7).

The default models ship in the wheel and the benchmark manifests are published in docs/; a
path like /work/shared/data/ispra-1min tells a user nothing and a stranger who built it. The
manifest schema keeps an absolute path in the data summary's ``source`` as its last component,
so training, retraining and annotation all write portable manifests.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tesla_gateway.contract.manifest import DataSummary

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = sorted(
    [*REPO.glob("models/*/manifest.json"), *REPO.glob("docs/benchmarks/**/manifest.json")]
)
# Where a builder's files live: a checkout, a home, a scratch folder, root's home.
BUILDER_PATH = re.compile(r"(?<![\w.~-])/(work|home|tmp|root|Users)/")


def test_there_are_committed_manifests_to_check() -> None:
    assert len([m for m in MANIFESTS if m.parts[-3] == "models"]) >= 3


@pytest.mark.parametrize("manifest", MANIFESTS, ids=lambda path: str(path.relative_to(REPO)))
def test_a_committed_manifest_holds_no_builder_path(manifest: Path) -> None:
    text = manifest.read_text(encoding="utf-8")
    found = [match.group() for match in BUILDER_PATH.finditer(text)]
    assert not found, f"{manifest.relative_to(REPO)} names the builder's folders {found}"


def summary(source: str) -> DataSummary:
    return DataSummary(
        source=source,
        target="ref_pm10",
        train_sensors=["a"],
        validation_sensor="b",
        test_sensor="c",
        rows_read=1,
        rows_dropped={},
        windows={"train": 1},
        attribution="test",
    )


@pytest.mark.parametrize(
    ("source", "written"),
    [
        ("ispra-1min:ispra-1min:/work/shared/data/ispra-1min", "ispra-1min:ispra-1min:ispra-1min"),
        ("csv:/home/ana/campaign/sensors.csv", "csv:sensors.csv"),
        ("pairs:/var/lib/tesla-gateway/state/pairs", "pairs:pairs"),
        ("senseurcity:Antwerp_402B00.csv,Zagreb_64C52B.csv", None),
        ("csv:data/relative.csv", None),
        ("synthetic:seed=3", None),
    ],
)
def test_the_data_source_keeps_a_path_as_its_last_component(
    source: str, written: str | None
) -> None:
    assert summary(source).source == (source if written is None else written)

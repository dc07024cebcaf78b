"""A bench stopped after a cell trained but before the cell was stored resumes from the training.

The stop is simulated by deleting the stored cell file after a complete run: the work
directory then holds exactly what a kill during export or measurement leaves (a finished run
directory and its marker, no cell). Training is replaced by a function that fails the test, so
reuse is proven by the cell being computed at all.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.training.bench.test_run import CONFIG as RUN_CONFIG
from training.bench import runner
from training.bench.grid import SweepConfig
from training.bench.runner import run_bench
from training.bench.trained_runs import MARKER_NAME
from training.train import train as train_for_real

CONFIG = RUN_CONFIG.model_copy(
    update={
        "models": ("dlinear",),
        "epa": False,
        "sweep": SweepConfig(enabled=False),
        "max_train_windows": 128,
        "case_study_models": (),
    }
)


def _cell_file(report_dir: Path) -> Path:
    (cell,) = (report_dir / "cells").glob("*dlinear*.json")
    return cell


def _run_dir(work_dir: Path) -> Path:
    (marker,) = work_dir.rglob(MARKER_NAME)
    return marker.parent


def _no_training(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("the cell was trained again instead of reusing its finished run")


def _counting_train(calls: list[int]) -> Any:
    def train(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return train_for_real(*args, **kwargs)

    return train


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One complete bench run (report and work directories), copied by each test."""
    base = tmp_path_factory.mktemp("finished")
    run_bench(CONFIG, base / "report", work_dir=base / "work", progress=False, write=False)
    return base


@pytest.fixture()
def stopped_before_storing(finished_run: Path, tmp_path: Path) -> tuple[Path, Path, dict[str, Any]]:
    shutil.copytree(finished_run, tmp_path, dirs_exist_ok=True)
    report_dir, work_dir = tmp_path / "report", tmp_path / "work"
    cell = _cell_file(report_dir)
    stored = json.loads(cell.read_text(encoding="utf-8"))
    cell.unlink()
    return report_dir, work_dir, stored


def test_a_finished_training_is_reused_with_its_scores_and_time(
    stopped_before_storing: tuple[Path, Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    report_dir, work_dir, before = stopped_before_storing
    monkeypatch.setattr(runner, "train", _no_training)
    summary = run_bench(CONFIG, report_dir, work_dir=work_dir, progress=False, write=False)
    after = json.loads(_cell_file(report_dir).read_text(encoding="utf-8"))
    assert len(summary.computed) == 1
    assert after["status"] == "done"
    assert after["test"] == before["test"]
    assert after["validation"] == before["validation"]
    assert after["history"] == before["history"]
    assert after["seconds"]["train"] == before["seconds"]["train"]
    for measured in ("parameters", "flops", "float_bytes", "export_verified"):
        assert after["efficiency"][measured] == before["efficiency"][measured]


def test_a_run_of_another_configuration_is_trained_again(
    stopped_before_storing: tuple[Path, Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    report_dir, work_dir, _ = stopped_before_storing
    calls: list[int] = []
    monkeypatch.setattr(runner, "train", _counting_train(calls))
    changed = CONFIG.model_copy(update={"max_train_windows": 96})
    run_bench(changed, report_dir, work_dir=work_dir, progress=False, write=False)
    assert calls == [1]
    marker = json.loads((_run_dir(work_dir) / MARKER_NAME).read_text(encoding="utf-8"))
    stored = json.loads(_cell_file(report_dir).read_text(encoding="utf-8"))
    assert marker["fingerprint"] == stored["fingerprint"]


@pytest.mark.parametrize(
    "damage",
    ["model.keras", "metrics.json", "config.json", MARKER_NAME],
)
def test_a_damaged_run_is_trained_again_not_trusted(
    stopped_before_storing: tuple[Path, Path, dict[str, Any]],
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:
    report_dir, work_dir, before = stopped_before_storing
    run_dir = _run_dir(work_dir)
    target = run_dir / damage
    target.write_bytes(target.read_bytes()[: max(1, target.stat().st_size // 3)])
    calls: list[int] = []
    monkeypatch.setattr(runner, "train", _counting_train(calls))
    run_bench(CONFIG, report_dir, work_dir=work_dir, progress=False, write=False)
    assert calls == [1]
    after = json.loads(_cell_file(report_dir).read_text(encoding="utf-8"))
    assert after["status"] == "done"
    assert after["test"] == before["test"]  # same seed, same data: the same model again
    assert (
        json.loads((run_dir / MARKER_NAME).read_text(encoding="utf-8"))["fingerprint"]
        == (before["fingerprint"])
    )


def test_training_that_never_finished_leaves_no_marker(
    stopped_before_storing: tuple[Path, Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    report_dir, work_dir, _ = stopped_before_storing
    run_dir = _run_dir(work_dir)

    def killed(config: Any, run_dir: Path, **kwargs: Any) -> Any:
        (run_dir / "model.keras").write_bytes(b"half")  # what a kill mid-save leaves
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "train", killed)
    changed = CONFIG.model_copy(update={"max_train_windows": 96})  # the marker is another's
    with pytest.raises(KeyboardInterrupt):
        run_bench(changed, report_dir, work_dir=work_dir, progress=False, write=False)
    assert not (run_dir / MARKER_NAME).exists()

    calls: list[int] = []
    monkeypatch.setattr(runner, "train", _counting_train(calls))
    run_bench(CONFIG, report_dir, work_dir=work_dir, progress=False, write=False)
    assert calls == [1]  # the first configuration's run was overwritten: it trains again

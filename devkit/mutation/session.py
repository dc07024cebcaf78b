"""One mutmut session per target, in a scratch copy of the checkout (never in the checkout).

mutmut copies the target's package into ``mutants/`` and runs the tests from there; doing that
in a scratch tree keeps mutated code away from anyone else's test run in the working checkout.
The tree is the committed ``HEAD`` (``git archive``), so a run measures what is committed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path

from devkit.mutation.targets import Target

__all__ = [
    "DETECTED",
    "UNMUTATED_LINES",
    "Mutant",
    "TargetResult",
    "archive_head",
    "collect",
    "merge_survivor_run",
    "recheck_at_import",
    "run_target",
]

# mutmut's exit codes per mutant, as its results name them (timeouts count as detected).
_STATUS = {
    0: "survived",
    1: "killed",
    3: "killed",
    5: "no tests",
    33: "no tests",
    34: "skipped",
    36: "timeout",
    24: "timeout",
    -24: "timeout",
    152: "timeout",
    255: "timeout",
    37: "caught by type check",
    -9: "killed",  # SIGKILL: a mutant that grows without bound, killed by the OOM killer
}
_QUICK_S = 1.0  # a test mutmut timed under this runs in the recheck's first pass
DETECTED = frozenset({"killed", "timeout", "caught by type check"})
# Statements starting on these lines are not mutated: an exception's message is prose for the
# operator, not a promise (its type and the condition that raises it are mutated).
UNMUTATED_LINES = (r"^\s*raise [\w.]+\(",)  # (dotted too: sqlite3.DatabaseError(...))


@dataclass(frozen=True)
class Mutant:
    """One mutant: its mutmut name, what became of it, and (unless killed) the lines it changed."""

    name: str
    status: str
    change: tuple[str, ...] = ()


@dataclass(frozen=True)
class TargetResult:
    target: Target
    mutants: tuple[Mutant, ...]
    seconds: float
    commit: str
    survivors_of: str | None = None  # only the survivors of the run at this commit were run

    def count(self, *statuses: str) -> int:
        return sum(mutant.status in statuses for mutant in self.mutants)

    def as_dict(self) -> dict[str, object]:
        return {
            "name": self.target.name,
            "modules": list(self.target.modules),
            "tests": list(self.target.tests),
            "seconds": round(self.seconds, 1),
            "commit": self.commit,
            **({"survivors_of": self.survivors_of} if self.survivors_of else {}),
            "mutants": [
                {"name": m.name, "status": m.status, "change": list(m.change)}
                if m.change
                else {"name": m.name, "status": m.status}
                for m in self.mutants
            ],
        }


def archive_head(checkout: Path, into: Path) -> str:
    """Unpack the checkout's committed HEAD into ``into``; returns the commit id."""
    commit = _git(checkout, "rev-parse", "HEAD").strip()
    archive = subprocess.run(  # noqa: S603 - git with fixed arguments
        ["git", "-C", str(checkout), "archive", "--format=tar", commit],  # noqa: S607
        check=True,
        capture_output=True,
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return commit


def run_target(
    tree: Path,
    target: Target,
    *,
    commit: str,
    mutmut: Path,
    max_children: int,
    log: Path,
    budget_s: float | None = None,
    only: tuple[str, ...] = (),
) -> TargetResult:
    """Run mutmut over ``target`` in ``tree`` (prepared by :func:`archive_head`).

    With ``budget_s`` the session is stopped after that long; the mutants it did not reach are
    recorded as ``not checked`` (the report counts them apart). With ``only``, just those
    mutants run (the others are ``not checked``).
    """
    _configure(tree, target)
    shutil.rmtree(tree / "mutants", ignore_errors=True)
    started = time.monotonic()
    with log.open("ab") as out:
        session = subprocess.Popen(  # noqa: S603 - the venv's own mutmut
            [str(mutmut), "run", "--max-children", str(max_children), *only],
            cwd=tree,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its forked workers go with it when the budget runs out
        )
        try:
            session.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            os.killpg(session.pid, signal.SIGTERM)
            session.wait()
        # What a mutant's timed-out test left running in the session's process group (a test
        # broker): the group is the session's own, so ending it touches nothing else.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(session.pid, signal.SIGTERM)
    return collect(tree, target, commit=commit, mutmut=mutmut, seconds=time.monotonic() - started)


def collect(
    tree: Path, target: Target, *, commit: str, mutmut: Path, seconds: float
) -> TargetResult:
    """What became of each mutant of a finished (or stopped) session in ``tree``; import-time
    survivors are checked again here."""
    mutants = []
    for module in target.modules:
        meta = tree / "mutants" / (module + ".meta")
        if not meta.exists():  # nothing mutable in it (e.g. only constants and imports)
            continue
        codes: dict[str, int | None] = json.loads(meta.read_text())["exit_code_by_key"]
        for name, code in sorted(codes.items(), key=lambda item: _natural(item[0])):
            status = "not checked" if code is None else _STATUS.get(code, f"exit {code}")
            if status == "survived" and name.startswith(_import_time_prefixes(target)):
                status = recheck_at_import(tree, target, name)
            unshown = DETECTED | {"not checked"}  # the report lists neither
            change = () if status in unshown else _change(tree, mutmut, name)
            mutants.append(Mutant(name, status, change))
    return TargetResult(target, tuple(mutants), seconds, commit)


def merge_survivor_run(result: TargetResult, earlier: Mapping[str, object]) -> TargetResult:
    """A run of only the earlier run's survivors, completed with the earlier run's status of
    every mutant it did not run (same modules, so the same mutants; tests were only added, so
    the killed stay killed, and a survivor a time budget left unreached stays as it was)."""
    before: list[dict[str, object]] = earlier["mutants"]  # type: ignore[assignment]
    by_name = {str(m["name"]): m for m in before}
    merged = []
    for mutant in result.mutants:
        was = by_name.get(mutant.name)
        if mutant.status == "not checked" and was is not None:
            change: list[str] = was.get("change", [])  # type: ignore[assignment]
            merged.append(Mutant(mutant.name, str(was["status"]), tuple(change)))
        else:
            merged.append(mutant)
    return TargetResult(
        result.target,
        tuple(merged),
        result.seconds,
        result.commit,
        survivors_of=str(earlier.get("survivors_of") or earlier["commit"]),
    )


def _import_time_prefixes(target: Target) -> tuple[str, ...]:
    return tuple(f"{function}__mutmut_" for function in target.import_time)


def recheck_at_import(tree: Path, target: Target, name: str) -> str:
    """Run the target's tests on one mutant of a function that runs at import, in a fresh
    process that imports the module with the mutant set: killed if any test fails (or the
    import does), survived otherwise."""
    environment = {**os.environ, "MUTANT_UNDER_TEST": name}
    for tests in _quick_first(tree, target):
        run = subprocess.run(  # noqa: S603 - the venv's own python and pytest
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
            cwd=tree / "mutants",
            env=environment,
            capture_output=True,
            check=False,
        )
        if run.returncode in {1, 2}:  # a test failed, or the import did (collection)
            return "killed"
        if run.returncode != 0:
            raise RuntimeError(f"recheck of {name}: pytest exit {run.returncode}: {run.stdout!r}")
    return "survived"


def _quick_first(tree: Path, target: Target) -> list[list[str]]:
    """The target's tests in two runs, those mutmut timed at a second or more last: a killed
    mutant usually fails a quick one, so the slow property tests run only for survivors (the
    same tests either way; without mutmut's timings, one run of every test file)."""
    stats = tree / "mutants" / "mutmut-stats.json"
    if not stats.exists():
        return [list(target.tests)]
    durations: dict[str, float] = json.loads(stats.read_text())["duration_by_test"]
    slow = sorted(test for test, seconds in durations.items() if seconds >= _QUICK_S)
    quick = [*target.tests, *(f"--deselect={test}" for test in slow)]
    return [quick, slow] if slow else [quick]


def _configure(tree: Path, target: Target) -> None:
    """Point mutmut at the target: its package, its modules, its tests, everything else copied.

    A module or test file the tree lacks (renamed or split since the target was written) is an
    error: mutmut would otherwise skip it silently and the report would cover less than it says.
    """
    absent = [path for path in (*target.modules, *target.tests) if not (tree / path).is_file()]
    if absent:
        raise FileNotFoundError(f"target {target.name}: not in the committed tree: {absent}")
    pyproject = tree / "pyproject.toml"
    original = tree / "pyproject.toml.orig"
    if not original.exists():
        shutil.copyfile(pyproject, original)
    also_copy = sorted(
        p.name
        for p in tree.iterdir()
        if p.name not in {target.package, "mutants", "pyproject.toml.orig", "pyproject.toml"}
    )
    section = {
        "source_paths": [target.package],
        "only_mutate": list(target.modules),
        "pytest_add_cli_args_test_selection": list(target.tests),
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-q", "--durations=0"],
        "also_copy": also_copy,
        "use_git_change_detection": False,
        "do_not_mutate_patterns": list(UNMUTATED_LINES),
    }
    lines = [f"{key} = {json.dumps(value)}" for key, value in section.items()]
    text = original.read_text(encoding="utf-8") + "\n[tool.mutmut]\n" + "\n".join(lines) + "\n"
    pyproject.write_text(text, encoding="utf-8")


def _change(tree: Path, mutmut: Path, name: str) -> tuple[str, ...]:
    """The removed and added lines of one mutant's diff (``mutmut show``)."""
    shown = subprocess.run(  # noqa: S603 - the venv's own mutmut
        [str(mutmut), "show", name], cwd=tree, capture_output=True, text=True, check=False
    ).stdout
    return tuple(
        line[0] + " " + line[1:].strip()
        for line in shown.splitlines()
        if line[:1] in {"-", "+"} and not line.startswith(("---", "+++"))
    )


def _natural(name: str) -> tuple[str, int]:
    stem, _, number = name.rpartition("_")
    return (stem, int(number)) if number.isdigit() else (name, 0)


def _git(checkout: Path, *args: str) -> str:
    return subprocess.run(  # noqa: S603 - git with fixed arguments
        ["git", "-C", str(checkout), *args],  # noqa: S607
        check=True,
        capture_output=True,
        text=True,
    ).stdout

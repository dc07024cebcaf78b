"""Run mutmut over each target in a scratch copy of HEAD and write the report.

Results are kept per target in ``devkit/mutation/results.json``; ``--only`` reruns some
targets and keeps the others' last figures, so the report always covers every target run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from devkit.mutation.report import Verdict, load_verdicts, render
from devkit.mutation.session import DETECTED, archive_head, merge_survivor_run, run_target
from devkit.mutation.targets import TARGETS, target_named

__all__ = ["main"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS_PATH = Path(__file__).with_name("results.json")
REPORT_PATH = ROOT / "docs" / "mutation.md"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devkit.mutation", description=__doc__)
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="TARGET",
        help=f"run only this target (repeatable); one of {[t.name for t in TARGETS]}",
    )
    parser.add_argument("--max-children", type=int, default=1, help="mutants run in parallel")
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="stop each target after this long (its unreached mutants: not checked)",
    )
    parser.add_argument(
        "--survivors",
        action="store_true",
        help=(
            "rerun only the mutants the recorded run left alive and not explained as"
            " equivalent (each target's modules must be unchanged since; the others keep their"
            " status): for tests added since"
        ),
    )
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite the report from the recorded results"
    )
    parser.add_argument(
        "--keep", action="store_true", help="keep the scratch tree (its path is printed)"
    )
    return parser


def _recorded() -> list[dict[str, object]]:
    if not RESULTS_PATH.exists():
        return []
    recorded: list[dict[str, object]] = json.loads(RESULTS_PATH.read_text(encoding="utf-8"))
    return recorded


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    targets = [target_named(name) for name in args.only] if args.only else list(TARGETS)
    by_name = {str(entry["name"]): entry for entry in _recorded()}
    if not args.report_only:
        mutmut = Path(sys.executable).with_name("mutmut")
        if not mutmut.exists():
            print("mutmut is not installed: make setup (it is in the dev extra)", file=sys.stderr)
            return 2
        os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        tree = Path(tempfile.mkdtemp(prefix="tesla-mutation-"))
        try:
            commit = archive_head(ROOT, tree)
            for target in targets:
                log = tree / f"mutmut-{target.name.replace(' ', '-')}.log"
                earlier = by_name.get(target.name) if args.survivors else None
                if args.survivors and earlier is None:
                    print(f"{target.name}: no recorded run to take survivors from", file=sys.stderr)
                    return 2
                only = _survivors_of(earlier, commit) if earlier is not None else ()
                if earlier is not None and not only:  # (mutmut would run every mutant)
                    print(f"{target.name}: no survivor to rerun; its record is kept", flush=True)
                    continue
                result = run_target(
                    tree,
                    target,
                    commit=commit,
                    mutmut=mutmut,
                    max_children=args.max_children,
                    log=log,
                    budget_s=args.budget_s,
                    only=only,
                )
                if earlier is not None:
                    result = merge_survivor_run(result, earlier)
                unchecked = result.count("not checked")
                survived = len(result.mutants) - result.count("killed", "timeout") - unchecked
                print(
                    f"{target.name}: {len(result.mutants)} mutants, {survived} not detected, "
                    f"{unchecked} not checked, {result.seconds:.0f} s",
                    flush=True,
                )
                # Read again: another run (of other targets) may have recorded since.
                by_name = {str(entry["name"]): entry for entry in _recorded()}
                by_name[target.name] = result.as_dict()
                RESULTS_PATH.write_text(
                    json.dumps(_in_target_order(by_name), indent=1) + "\n", encoding="utf-8"
                )
        finally:
            if args.keep:
                print(f"scratch tree kept at {tree}")
            else:
                shutil.rmtree(tree, ignore_errors=True)
    report = render(_in_target_order(by_name), load_verdicts(), mutmut_version=version("mutmut"))
    REPORT_PATH.write_text(report, encoding="utf-8")
    print(f"wrote {REPORT_PATH.relative_to(ROOT)}")
    return 0


def _survivors_of(earlier: dict[str, object], commit: str) -> tuple[str, ...]:
    """The recorded run's undetected mutants not explained as equivalent, if its modules are
    unchanged since (else the mutants are renumbered and the killed ones' status means
    nothing). The equivalent keep their earlier status: that can only understate the rate."""
    modules = [str(module) for module in earlier["modules"]]  # type: ignore[attr-defined]
    changed = subprocess.run(  # noqa: S603 - git with fixed arguments
        ["git", "-C", str(ROOT), "diff", "--quiet", str(earlier["commit"]), commit, "--", *modules],  # noqa: S607
        check=False,
    )
    if changed.returncode != 0:
        raise SystemExit(
            f"{earlier['name']}: modules changed since {earlier['commit']}: run it whole"
        )
    verdicts = load_verdicts()
    mutants: list[dict[str, object]] = earlier["mutants"]  # type: ignore[assignment]
    return tuple(
        str(m["name"])
        for m in mutants
        if m["status"] not in DETECTED and not _equivalent(m, verdicts.get(str(m["name"])))
    )


def _equivalent(mutant: dict[str, object], verdict: Verdict | None) -> bool:
    change: list[str] = mutant.get("change", [])  # type: ignore[assignment]
    added = next((line[2:] for line in change if line.startswith("+ ")), "")
    return verdict is not None and verdict.added == added and verdict.verdict.startswith("equiv")


def _in_target_order(by_name: dict[str, dict[str, object]]) -> list[dict[str, object]]:
    return [by_name[t.name] for t in TARGETS if t.name in by_name]

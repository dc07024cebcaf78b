"""docs/mutation.md from the recorded results and the verdicts on survivors.

A verdict names the mutant and the line it adds, so a verdict whose mutant was renumbered (its
function changed) shows up as missing instead of silently explaining another mutant. A
verdict may say the mutant is equivalent (why) or which test now kills it; the latter are listed
once they are killed, and flagged if they survive again.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from devkit.mutation.session import DETECTED

__all__ = ["Verdict", "load_verdicts", "render"]

VERDICTS_PATH = Path(__file__).with_name("verdicts.toml")


@dataclass(frozen=True)
class Verdict:
    mutant: str
    added: str  # the mutant's added line, stripped ("" when it only removes)
    verdict: str  # "equivalent: why" or "killed by tests/...::test_x"

    @property
    def killed_by_test(self) -> bool:
        return self.verdict.startswith("killed by")


def load_verdicts(path: Path = VERDICTS_PATH) -> dict[str, Verdict]:
    document = tomllib.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    return {
        entry["mutant"]: Verdict(entry["mutant"], entry.get("added", ""), entry["verdict"])
        for entry in document.get("survivor", [])
    }


def _added(change: Sequence[str]) -> str:
    added = [line[2:] for line in change if line.startswith("+ ")]
    return added[0] if added else ""


def _code(change: Sequence[str]) -> str:
    return " → ".join(f"`{line}`" for line in change) if change else "(no diff)"


def _rate(detected: int, total: int) -> str:
    return f"{100 * detected / total:.1f} %" if total else "–"


def render(
    results: Sequence[Mapping[str, object]],
    verdicts: Mapping[str, Verdict],
    *,
    mutmut_version: str,
) -> str:
    """The whole report, one section per target in the recorded order."""
    rows = []
    survivor_sections = []
    killed_since: list[str] = []
    totals = {"mutants": 0, "detected": 0, "equivalent": 0}
    for result in results:
        every: list[dict[str, object]] = result["mutants"]  # type: ignore[assignment]
        mutants = [m for m in every if m["status"] != "not checked"]
        unchecked = len(every) - len(mutants)
        total = len(mutants)
        detected = sum(m["status"] in DETECTED for m in mutants)
        equivalent = 0
        lines = []
        for mutant in mutants:
            name = str(mutant["name"])
            verdict = verdicts.get(name)
            change: list[str] = mutant.get("change", [])  # type: ignore[assignment]
            if mutant["status"] in DETECTED:
                if verdict is not None and verdict.killed_by_test:
                    killed_since.append(f"- `{name}`: {verdict.verdict}")
                continue
            if verdict is None or verdict.added != _added(change):
                text = "**unexplained**"
            elif verdict.killed_by_test:
                text = f"**survives again** (was {verdict.verdict})"
            else:
                text = verdict.verdict
                equivalent += verdict.verdict.startswith("equivalent")
            lines.append(f"- `{name}` ({mutant['status']}): {_code(change)}: {text}")
        totals["mutants"] += total
        totals["detected"] += detected
        totals["equivalent"] += equivalent
        modules = ", ".join(f"`{m}`" for m in result["modules"])  # type: ignore[attr-defined]
        rows.append(
            f"| {result['name']} | {modules} | {total} | {detected} | {total - detected} | "
            f"{equivalent} | {_rate(detected, total)} | {_rate(detected, total - equivalent)} | "
            f"{result['seconds']:.0f} s |"
            + (f" {unchecked} not reached" if unchecked else "")
            + (
                f" only the survivors of the run at {str(result['survivors_of'])[:10]} rerun"
                if result.get("survivors_of")
                else ""
            )
        )
        if lines:
            survivor_sections.append(f"### {result['name']}\n\n" + "\n".join(lines))
    commits = sorted({str(result["commit"])[:10] for result in results})
    overall = _rate(totals["detected"], totals["mutants"])
    overall_net = _rate(totals["detected"], totals["mutants"] - totals["equivalent"])
    parts = [
        "# Mutation testing",
        "",
        "Written by `make mutation` (`devkit/mutation`, mutmut "
        f"{mutmut_version}) from the committed tree at {', '.join(commits)}; not part of "
        "`make test`. Each target is one mutmut session in a scratch copy: its modules are "
        "mutated one change at a time and each mutant runs only those of the target's test "
        "files' tests that execute the function it changes (test files per target: "
        "`devkit/mutation/targets.py`). *Detected* counts killed mutants and timeouts. The rate "
        "without equivalents leaves out the survivors explained below as equivalent (no test "
        "can tell them from the original). Verdicts: `devkit/mutation/verdicts.toml`. "
        "Statements raising an exception are not mutated (its message is prose, not a "
        "promise; its type and the condition that raises it are); by the same rule a mutant "
        "whose only effect is which message an error of the same type carries, for the same "
        "input and with the same outcome, is equivalent (its verdict says *message only*). "
        "Log events and their fields are promises (tests assert them with "
        "`structlog.testing.capture_logs`). Functions that run when their module is imported "
        "(`import_time` in targets.py) are checked again in a fresh process per surviving "
        "mutant: mutmut's workers import the modules before a mutant is set. A target run with "
        "a time "
        "budget (`--budget-s`) counts only the mutants it reached; the rest are noted after "
        "its time. A target rerun with `--survivors` (its modules unchanged, tests added) ran "
        "only the mutants its earlier run left alive and not explained as equivalent; the "
        "others (and survivors a time budget left unreached) keep their earlier status, as "
        "noted after its time (the rerun's).",
        "",
        f"**Overall: {totals['detected']} of {totals['mutants']} detected ({overall}); "
        f"{overall_net} without the {totals['equivalent']} equivalent mutants.**",
        "",
        "| target | modules | mutants | detected | survived | equivalent | kill rate | "
        "without equivalents | time |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        "## Survivors",
        "",
        "Each survivor with the line it changes and its verdict.",
        "",
        "\n\n".join(survivor_sections) if survivor_sections else "None.",
        "",
    ]
    if killed_since:
        parts += [
            "## Survivors of earlier runs, now killed by a new test",
            "",
            *killed_since,
            "",
        ]
    return "\n".join(parts)

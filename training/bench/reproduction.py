"""What of the paper's claims the stored cells reproduce, written from the numbers.

With several seeds per cell, a difference between two models counts only when their ranges
over seeds do not overlap (``separated``; a reference row such as OLS has no seed and is a
point); with one seed of a learned model nothing is separated, since a single run says
nothing about seed noise (the committed small run showed TESLA moving by
several tenths of a µg/m³ between seeds). The section rewrites itself as cells arrive: every
statement names the cells it rests on and how many seeds they have.

The claims checked (the paper's Table 1 and Table 2):

* TESLA has the lowest RMSE of the paper's eight models in every region and feature;
* TESLA beats the practitioners' OLS calibration on the current reading;
* the cumulative ablation path from the Transformer improves at every step;
* removing any one of TESLA's changes makes it worse.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["Spread", "reproduction_lines", "separated"]


@dataclass(frozen=True)
class Spread:
    """Test RMSE of one cell over its seeds (``seeds`` 0: a reference row, nothing random)."""

    mean: float
    low: float
    high: float
    seeds: int

    def text(self) -> str:
        if self.seeds == 0:
            return f"{self.mean:.2f}"
        if self.seeds < 2:
            return f"{self.mean:.2f} (1 seed)"
        return f"{self.mean:.2f} [{self.low:.2f}–{self.high:.2f}, {self.seeds} seeds]"


def separated(a: Spread, b: Spread) -> bool:
    """True when each is a reference row or has two or more seeds, and the ranges are apart."""
    known = all(s.seeds == 0 or s.seeds >= 2 for s in (a, b))
    return known and (a.high < b.low or b.high < a.low)


def _verdict(better: Spread, worse: Spread) -> str:
    if better.seeds == 1 or worse.seeds == 1:
        return "one seed, so not judged against seed noise"
    return "separated over seeds" if separated(better, worse) else "within the seeds' spread"


def _compare(name_a: str, a: Spread, name_b: str, b: Spread) -> str:
    """``a`` against ``b``: which is lower and whether the ranges separate them."""
    if a.mean < b.mean:
        return f"{name_a} {a.text()} below {name_b} {b.text()}: {_verdict(a, b)}"
    return f"{name_a} {a.text()} not below {name_b} {b.text()}: {_verdict(b, a)}"


def reproduction_lines(
    columns: Sequence[str],
    spread: Callable[[str, str], Spread | None],
    paper_models: Sequence[str],
    chain: Sequence[str],
    one_at_a_time: Sequence[str],
) -> list[str]:
    """Markdown bullets per column (``spread(column, model)``: that cell, or None if missing)."""
    lines: list[str] = []
    for column in columns:
        lines += [f"**{column}**", ""]
        tesla = spread(column, "tesla")
        if tesla is None:
            lines += ["- TESLA not yet computed: nothing to compare.", ""]
            continue
        present = {m: s for m in paper_models if (s := spread(column, m)) is not None}
        missing = [m for m in paper_models if m not in present]
        ranked = sorted(present, key=lambda m: present[m].mean)
        rank = ranked.index("tesla") + 1
        line = f"- Table 1: TESLA ranks {rank} of {len(present)} of the paper's models"
        if missing:
            line += f" computed so far (missing: {', '.join(missing)})"
        if rank == 1 and len(ranked) > 1:
            runner = ranked[1]
            line += f"; {_compare('TESLA', tesla, runner, present[runner])}."
        elif rank > 1:
            best = ranked[0]
            line += f" (paper: first); {_compare(best, present[best], 'TESLA', tesla)}."
        else:
            line += "."
        lines.append(line)
        ols = spread(column, "ols")
        if ols is not None:
            lines.append(
                f"- Against OLS on the current reading: {_compare('TESLA', tesla, 'OLS', ols)}."
            )
        steps = [(m, spread(column, m)) for m in chain]
        for (before, a), (after, b) in itertools.pairwise(steps):
            if a is None or b is None:
                lines.append(f"- Table 2, {before} → {after}: not yet computed.")
            else:
                lines.append(f"- Table 2, {before} → {after}: {_compare(after, b, before, a)}.")
        for model in one_at_a_time:
            variant = spread(column, model)
            if model == "tesla" or variant is None:
                continue
            lines.append(
                f"- One change removed, {model}: {_compare('TESLA', tesla, model, variant)}."
            )
        lines.append("")
    return lines
